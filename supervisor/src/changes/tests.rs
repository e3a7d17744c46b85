//! Git's output read into changed files (what is left out, the limits, the keeps), and the
//! review's git on a real repository: untracked files in the diff with the index
//! untouched, a revert that loses nothing.

use std::collections::BTreeMap;

use protocol::api::ChangeKind;

use super::{MAX_DIFF_BYTES, Reading, assemble, git, parse_numstat, split_patch};
use crate::snapshot::tests::{racily_clean_edit, run};

const PATCH: &str = "diff --git a/f b/f
index de980441c3ab03a8c07dda1ad27b8a11f39deb1e..7be73ce3c1b1cdaea86e8168dfee8575175953bf 100644
--- a/f
+++ b/f
@@ -1,3 +1,3 @@
 a
-b
+B
 c
diff --git a/gone b/gone
deleted file mode 100644
index 587be6b4c3f93f93c489c0111bba5596147a26cb..0000000000000000000000000000000000000000
--- a/gone
+++ /dev/null
@@ -1 +0,0 @@
-diff --git a/x b/x
diff --git a/img.png b/img.png
new file mode 100644
index 0000000000000000000000000000000000000000..3e757656cf36eca53338e520d134963a44f793f8
Binary files /dev/null and b/img.png differ
";

const NUMSTAT: &str = "1\t1\tf\x000\t1\tgone\x00-\t-\timg.png\x00";

#[test]
fn numstat_and_patch_are_read_per_file_in_order() {
    let counted = parse_numstat(NUMSTAT);
    let paths: Vec<&str> = counted.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["f", "gone", "img.png"]);
    assert_eq!(counted[0].lines, Some((1, 1)));
    assert_eq!(counted[2].lines, None);
    let patches = split_patch(PATCH);
    // A removed line that reads like a file's header does not start a file.
    assert_eq!(patches.len(), 3);
    assert_eq!(patches[0].kind, ChangeKind::Modified);
    assert_eq!(patches[0].content.as_deref(), Some("7be73ce3c1b1cdaea86e8168dfee8575175953bf"));
    assert!(patches[0].text.ends_with(" c\n"));
    assert_eq!((patches[1].kind, patches[1].content.as_deref()), (ChangeKind::Deleted, Some("-")));
    assert!(patches[1].text.contains("-diff --git a/x b/x"));
    assert_eq!(patches[2].kind, ChangeKind::Added);
    assert!(patches[2].binary);
}

#[test]
fn a_file_as_it_was_at_the_start_is_left_out_and_a_keep_holds_for_its_content_only() {
    let reading = Reading {
        numstat: NUMSTAT.into(),
        patch: PATCH.into(),
        // `gone` was already deleted before the session: not its change.
        dirty_at_start: BTreeMap::from([("gone".into(), "-".into()), ("f".into(), "0abc".into())]),
        keeps: BTreeMap::from([
            ("f".into(), "7be73ce3c1b1cdaea86e8168dfee8575175953bf".into()),
            ("img.png".into(), "an older content".into()),
        ]),
    };
    let assembled = assemble(&reading);
    let files: Vec<(&str, bool)> =
        assembled.files.iter().map(|f| (f.path.as_str(), f.kept)).collect();
    assert_eq!(files, [("f", true), ("img.png", false)]);
    assert_eq!(assembled.files[0].additions, Some(1));
    assert!(assembled.files[0].diff.as_deref().unwrap().contains("+B"));
    assert_eq!(assembled.files[1].diff, None);
    assert_eq!(assembled.files[1].omitted.as_deref(), Some("binary file"));
    assert!(!assembled.truncated && !assembled.mismatch);
}

#[test]
fn a_diff_over_the_limit_is_omitted_with_why_and_lists_that_disagree_drop_the_diffs() {
    let big = format!(
        "diff --git a/big b/big\nindex 1..2 100644\n@@ -1 +1 @@\n+{}\n",
        "x".repeat(MAX_DIFF_BYTES)
    );
    let reading = Reading { numstat: "1\t0\tbig\0".into(), patch: big, ..Reading::default() };
    let assembled = assemble(&reading);
    assert_eq!(assembled.files[0].diff, None);
    assert!(assembled.files[0].omitted.as_deref().unwrap().contains("too large"));
    let reading = Reading { numstat: NUMSTAT.into(), patch: "".into(), ..Reading::default() };
    let assembled = assemble(&reading);
    assert!(assembled.mismatch);
    assert_eq!(assembled.files.len(), 3);
    assert!(assembled.files.iter().all(|f| f.diff.is_none() && f.omitted.is_some()));
}

#[tokio::test]
async fn the_diff_has_untracked_files_leaves_the_index_alone_and_a_revert_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    run(top, &["init", "-q"]).await;
    std::fs::write(top.join("kept.txt"), "one\ntwo\n").unwrap();
    std::fs::write(top.join(".gitignore"), "ignored\n").unwrap();
    run(top, &["add", "."]).await;
    run(top, &["commit", "-qm", "base"]).await;
    let start = run(top, &["rev-parse", "HEAD"]).await;
    std::fs::write(top.join("kept.txt"), "one\n2\n").unwrap();
    std::fs::create_dir(top.join("new dir")).unwrap();
    std::fs::write(top.join("new dir/added.rs"), "fn main() {}\n").unwrap();
    std::fs::write(top.join("ignored"), "build output\n").unwrap();
    let index_before = std::fs::read(top.join(".git/index")).unwrap();

    let repo = git::repository(top, Some(&start)).await.unwrap();
    assert_eq!(repo.base, start);
    let (numstat, patch) = git::diff(&repo).await.unwrap();
    let files = assemble(&Reading { numstat, patch, ..Reading::default() }).files;
    let paths: Vec<(&str, ChangeKind)> = files.iter().map(|f| (f.path.as_str(), f.kind)).collect();
    assert_eq!(
        paths,
        [("kept.txt", ChangeKind::Modified), ("new dir/added.rs", ChangeKind::Added)]
    );
    assert_eq!(files[1].content, run(top, &["hash-object", "new dir/added.rs"]).await);
    assert_eq!(std::fs::read(top.join(".git/index")).unwrap(), index_before);
    assert_eq!(run(top, &["status", "--porcelain"]).await.lines().count(), 2);

    // Reverting the added file removes it; the modified one goes back to the base.
    let saved = git::revert(&repo, "new dir/added.rs", "refs/tether/reverted/s/1").await.unwrap();
    assert!(!top.join("new dir/added.rs").exists());
    git::revert(&repo, "kept.txt", "refs/tether/reverted/s/2").await.unwrap();
    assert_eq!(std::fs::read_to_string(top.join("kept.txt")).unwrap(), "one\ntwo\n");
    assert_eq!(run(top, &["status", "--porcelain"]).await, "");
    // What the reverts took away is on their refs.
    assert_eq!(run(top, &["show", &format!("{saved}:new dir/added.rs")]).await, "fn main() {}");
    assert_eq!(run(top, &["show", "refs/tether/reverted/s/2:kept.txt"]).await, "one\n2");
    assert_eq!(std::fs::read_to_string(top.join("ignored")).unwrap(), "build output\n");
}

#[tokio::test]
async fn a_workspace_that_is_gone_or_not_a_repository_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let err = git::repository(&dir.path().join("gone"), None).await.unwrap_err();
    assert!(matches!(err, super::ChangesError::WorkspaceGone(_)), "{err}");
    let err = git::repository(dir.path(), None).await.unwrap_err();
    assert!(matches!(err, super::ChangesError::NotRepository(_)), "{err}");
}

#[tokio::test]
async fn a_same_size_edit_in_the_second_the_index_was_written_is_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    racily_clean_edit(top).await;
    let repo = git::repository(top, None).await.unwrap();
    let (numstat, patch) = git::diff(&repo).await.unwrap();
    let files = assemble(&Reading { numstat, patch, ..Reading::default() }).files;
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["same.txt"]);
    assert_eq!(run(top, &["status", "--porcelain"]).await, "M same.txt", "as git itself sees it");
}

#[test]
fn a_prompt_goes_as_written_without_notes_and_after_them_with_some() {
    assert_eq!(super::with_notes(&[], "go on"), "go on");
    let notes = ["a was reverted".to_owned(), "b was reverted".to_owned()];
    assert_eq!(
        super::with_notes(&notes, "go on"),
        "[Tether, not the user: since your last turn\n- a was reverted\n- b was reverted]\n\ngo on"
    );
}
