//! Checkpoints: which files go in (pure), and the git on real workspaces — the user's
//! repository untouched, each turn's ref, only changes stored, a restore byte for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use protocol::api::{CheckpointTrigger, LeftOut};

use super::{Candidate, CheckpointError, Checkpoints, Limits, Request, select};
use crate::ids::{SessionId, TurnId};
use crate::snapshot::tests::run;
use crate::store::Store;

fn candidate(path: &str, size: Option<u64>, indexed: bool) -> Candidate {
    Candidate { path: path.into(), size, indexed }
}

#[test]
fn a_checkpoint_keeps_files_within_the_limit_and_lists_the_others() {
    let limits = Limits { max_file_bytes: 10, max_workspace_bytes: 100, ..Limits::default() };
    let picked = select(
        vec![
            candidate("a", Some(3), false),
            candidate("big", Some(11), false),
            candidate("grew", Some(50), true),
            candidate("gone", None, true),
            candidate("vanished", None, false),
            candidate("b", Some(10), true),
        ],
        &limits,
    )
    .unwrap();
    assert_eq!(picked.update, ["a", "gone", "b"]);
    assert_eq!(picked.drop, ["grew"]);
    assert_eq!(
        picked.left_out,
        [LeftOut { path: "big".into(), bytes: 11 }, LeftOut { path: "grew".into(), bytes: 50 }]
    );
    assert_eq!((picked.files, picked.bytes), (2, 13));
}

#[test]
fn a_workspace_over_its_limit_is_not_checkpointed() {
    let limits = Limits { max_file_bytes: 10, max_workspace_bytes: 15, ..Limits::default() };
    let over =
        select(vec![candidate("a", Some(8), false), candidate("b", Some(8), false)], &limits);
    assert!(matches!(over, Err(CheckpointError::TooBig { bytes: 16, limit: 15 })), "{over:?}");
}

/// Every file under `dir` but `.git`'s, path → content (a symlink: its target).
pub(crate) fn files_of(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(top: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(top).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if name == ".git" {
                continue;
            } else if meta.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(name, target.display().to_string().into_bytes());
            } else if meta.is_dir() {
                walk(top, &path, out);
            } else {
                out.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// `len` bytes no compressor shrinks (random ones).
pub(crate) fn incompressible(len: usize) -> Vec<u8> {
    (0..len.div_ceil(16)).flat_map(|_| uuid::Uuid::new_v4().into_bytes()).take(len).collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    _store_dir: tempfile::TempDir,
    store: Store,
    session: SessionId,
    session_dir: PathBuf,
    workspace: PathBuf,
}

async fn fixture() -> Fixture {
    let (store_dir, store) = crate::store::tests::open();
    let task = store.create_task("t".into(), String::new()).await.unwrap();
    let row = store.create_session(crate::store::tests::session(&task.id)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("work");
    let session_dir = dir.path().join("session");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::create_dir_all(&session_dir).unwrap();
    Fixture { _dir: dir, _store_dir: store_dir, store, session: row.id, session_dir, workspace }
}

impl Fixture {
    fn request(&self, trigger: CheckpointTrigger, turn_id: Option<&TurnId>) -> Request {
        Request {
            runtime: None,
            session_id: self.session.clone(),
            session_dir: self.session_dir.clone(),
            workspace: self.workspace.clone(),
            trigger,
            turn_id: turn_id.cloned(),
        }
    }

    async fn turn(&self) -> TurnId {
        let turn = TurnId::new(uuid::Uuid::now_v7().to_string());
        let prompt = ("p".to_owned(), None, None);
        let execution = crate::ids::ExecutionId::new("e");
        let request = uuid::Uuid::now_v7().to_string();
        self.store
            .insert_turn(turn.clone(), self.session.clone(), execution, request, prompt)
            .await
            .unwrap();
        turn
    }

    fn write(&self, path: &str, content: &[u8]) {
        let path = self.workspace.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
}

/// What the user's repository shows: HEAD, branches, its index file's bytes, status.
async fn user_state(repo: &Path) -> (String, String, Vec<u8>, String) {
    (
        run(repo, &["rev-parse", "HEAD"]).await,
        run(repo, &["for-each-ref"]).await,
        std::fs::read(repo.join(".git/index")).unwrap(),
        run(repo, &["status", "--porcelain"]).await,
    )
}

#[tokio::test]
async fn each_turn_gets_a_ref_whose_files_restore_byte_for_byte_and_the_users_repo_is_untouched() {
    let f = fixture().await;
    run(&f.workspace, &["init", "-q", "-b", "main"]).await;
    f.write(".gitignore", b"target/\n");
    f.write("src/lib.rs", b"fn a() {}\n");
    run(&f.workspace, &["add", "."]).await;
    run(&f.workspace, &["commit", "-qm", "base"]).await;
    f.write("src/lib.rs", b"fn a() { changed }\n");
    f.write("notes/new.md", b"untracked\n");
    f.write("target/out.bin", b"ignored build output");
    std::os::unix::fs::symlink("src/lib.rs", f.workspace.join("link")).unwrap();
    let before = user_state(&f.workspace).await;
    let checkpoints = Checkpoints::new(Limits::default());

    let first_turn = f.turn().await;
    let first = checkpoints
        .take(&f.store, f.request(CheckpointTrigger::Turn, Some(&first_turn)))
        .await
        .unwrap()
        .unwrap();
    let at_first = files_of(&f.workspace);
    assert_eq!(user_state(&f.workspace).await, before, "the user's repository moved");
    assert_eq!((first.seq, first.turn), (1, Some(1)));
    assert_eq!(first.git_ref, format!("refs/tether/sessions/{}/turns/1", f.session));
    assert_eq!(first.files, 4, "{first:?}");

    f.write("src/lib.rs", b"fn a() { second }\n");
    std::fs::remove_file(f.workspace.join("notes/new.md")).unwrap();
    let second_turn = f.turn().await;
    let second = checkpoints
        .take(&f.store, f.request(CheckpointTrigger::Turn, Some(&second_turn)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((second.seq, second.turn, second.files), (2, Some(2), 3));
    let listed = f.store.checkpoints(f.session.clone()).await.unwrap();
    assert_eq!(listed, [first.clone(), second.clone()]);

    // The first turn's files, as they were, wherever they are written.
    let out = tempfile::tempdir().unwrap();
    let into = out.path().join("restored");
    let (restored, files) = checkpoints
        .restore_into(&f.store, f.session.clone(), &f.session_dir, 1, &into)
        .await
        .unwrap();
    assert_eq!((restored.seq, files), (1, 4));
    let mut expected = at_first;
    expected.remove("target/out.bin");
    assert_eq!(files_of(&into), expected);
    assert!(std::fs::symlink_metadata(into.join("link")).unwrap().is_symlink());
    // The repository's ref names that commit.
    let repo = Checkpoints::repository(&f.session_dir);
    let named = run(&repo, &["rev-parse", &second.git_ref]).await;
    assert_eq!(named, second.commit);
    assert_eq!(run(&repo, &["rev-parse", &format!("{}^", second.commit)]).await, first.commit);
}

#[tokio::test]
async fn a_checkpoint_stores_only_what_changed_and_leaves_out_files_over_the_limit() {
    let f = fixture().await;
    // A workspace that is not a repository at all.
    let noise = incompressible(2_000_000);
    f.write("data/big-but-allowed.bin", &noise);
    f.write("huge.iso", &vec![7u8; 3_000_000]);
    let limits = Limits { max_file_bytes: 2_500_000, ..Limits::default() };
    let checkpoints = Checkpoints::new(limits);
    let turn = f.turn().await;
    let first = checkpoints
        .take(&f.store, f.request(CheckpointTrigger::Turn, Some(&turn)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.left_out, [LeftOut { path: "huge.iso".into(), bytes: 3_000_000 }]);
    assert!(first.added_bytes >= 1_900_000, "{first:?}");
    f.write("small.txt", b"a line\n");
    let turn = f.turn().await;
    let second = checkpoints
        .take(&f.store, f.request(CheckpointTrigger::Turn, Some(&turn)))
        .await
        .unwrap()
        .unwrap();
    assert!(second.added_bytes < 64 * 1024, "a 7-byte change added {}", second.added_bytes);
    // A pause with nothing changed since takes none; with a change, one of its own.
    let paused = checkpoints.take(&f.store, f.request(CheckpointTrigger::Pause, None)).await;
    assert!(paused.unwrap().is_none());
    f.write("small.txt", b"another\n");
    let stopped = checkpoints
        .take(&f.store, f.request(CheckpointTrigger::Stop, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stopped.git_ref, format!("refs/tether/sessions/{}/stop/3", f.session));
}

#[tokio::test]
async fn a_lock_left_by_a_killed_checkpoint_does_not_stop_the_next() {
    let f = fixture().await;
    f.write("a.txt", b"a");
    let checkpoints = Checkpoints::new(Limits::default());
    checkpoints.take(&f.store, f.request(CheckpointTrigger::Pause, None)).await.unwrap();
    let repo = Checkpoints::repository(&f.session_dir);
    std::fs::write(repo.join("index.lock"), b"").unwrap();
    f.write("a.txt", b"b");
    let next = checkpoints.take(&f.store, f.request(CheckpointTrigger::Pause, None)).await;
    assert_eq!(next.unwrap().unwrap().seq, 2);
}

#[tokio::test]
async fn a_restore_refuses_a_directory_that_is_not_empty_and_a_relative_one() {
    let f = fixture().await;
    f.write("a.txt", b"a");
    let checkpoints = Checkpoints::new(Limits::default());
    checkpoints.take(&f.store, f.request(CheckpointTrigger::Pause, None)).await.unwrap();
    let full = tempfile::tempdir().unwrap();
    std::fs::write(full.path().join("mine"), b"keep me").unwrap();
    let refused =
        checkpoints.restore_into(&f.store, f.session.clone(), &f.session_dir, 1, full.path()).await;
    assert!(matches!(refused, Err(CheckpointError::Refused(_))), "{refused:?}");
    assert_eq!(std::fs::read(full.path().join("mine")).unwrap(), b"keep me");
    let relative = Path::new("relative/dir");
    let refused =
        checkpoints.restore_into(&f.store, f.session.clone(), &f.session_dir, 1, relative).await;
    assert!(matches!(refused, Err(CheckpointError::Refused(_))), "{refused:?}");
    let missing = checkpoints
        .restore_into(&f.store, f.session.clone(), &f.session_dir, 9, &full.path().join("new"))
        .await;
    assert!(matches!(missing, Err(CheckpointError::NotFound(_))), "{missing:?}");
}

#[tokio::test]
async fn a_turn_waits_for_the_checkpoint_in_flight() {
    let f = fixture().await;
    f.write("a.txt", b"a");
    let checkpoints = std::sync::Arc::new(Checkpoints::new(Limits::default()));
    checkpoints.spawn(f.store.clone(), f.request(CheckpointTrigger::Pause, None));
    // Held from the spawn on: settling waits for it, then it is stored.
    assert!(checkpoints.settle(&f.session).await);
    assert_eq!(f.store.checkpoints(f.session.clone()).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_same_size_edit_right_after_a_checkpoint_is_in_the_next() {
    let f = fixture().await;
    let repo = super::git::Repo::open(&f.session_dir.join("r.git")).await.unwrap();
    let limits = Limits::default();
    for n in 0..20u32 {
        let path = format!("f{n}.bin");
        f.write(&path, &incompressible(4096));
        let first = repo.commit(&f.workspace, &limits, None, "first").await.unwrap();
        // The same size, written within the same second as the index.
        let mut other = incompressible(4096);
        other[0] = other[0].wrapping_add(1 + n as u8);
        f.write(&path, &other);
        let next = repo.commit(&f.workspace, &limits, Some(&first.commit), "next").await.unwrap();
        assert_ne!(next.tree, first.tree, "round {n}: the edit was missed");
        let out = tempfile::tempdir().unwrap();
        let into = out.path().join("x");
        std::fs::create_dir_all(&into).unwrap();
        repo.write_out(&next.commit, &into).await.unwrap();
        assert_eq!(std::fs::read(into.join(&path)).unwrap(), other, "round {n}");
    }
}

#[tokio::test]
async fn a_deleted_session_is_not_checkpointed_and_its_directory_not_made_again() {
    let f = fixture().await;
    f.write("a.txt", b"a");
    let checkpoints = std::sync::Arc::new(Checkpoints::new(Limits::default()));
    // A delete holds the session's lock while its rows and files go; a checkpoint asked
    // for meanwhile waits, then finds no session.
    let held = checkpoints.hold(&f.session).await;
    let taken = checkpoints.spawn(f.store.clone(), f.request(CheckpointTrigger::Stop, None));
    f.store.delete_session(f.session.clone()).await.unwrap();
    std::fs::remove_dir_all(&f.session_dir).unwrap();
    drop(held);
    assert_eq!(taken.await.unwrap(), None);
    assert!(!f.session_dir.exists(), "the deleted session's directory was made again");
}

#[tokio::test]
async fn a_workspace_overlaid_with_a_turns_checkpoint_holds_its_files_and_what_it_had_is_kept() {
    let f = fixture().await;
    let limits = Limits { max_file_bytes: 64, ..Limits::default() };
    let checkpoints = Checkpoints::new(limits);
    f.write(".gitignore", b"target/\n");
    f.write("a.txt", b"one");
    f.write("gone/later.txt", b"deleted after the turn");
    let turn = f.turn().await;
    checkpoints.take(&f.store, f.request(CheckpointTrigger::Turn, Some(&turn))).await.unwrap();
    let at_turn = files_of(&f.workspace);
    // Later: a.txt edited, a file removed, one added, an ignored one and one over the
    // per-file limit (no checkpoint holds it) appear.
    f.write("a.txt", b"edited");
    std::fs::remove_file(f.workspace.join("gone/later.txt")).unwrap();
    f.write("new.txt", b"after the turn");
    f.write("target/build.out", b"ignored");
    f.write("big.bin", &[7; 100]);
    f.write("nested/kept.txt", b"a repository of its own");
    run(&f.workspace.join("nested"), &["init", "-q"]).await;
    let before: BTreeMap<String, Vec<u8>> = files_of(&f.workspace)
        .into_iter()
        .filter(|(path, _)| !path.starts_with("nested/.git/"))
        .collect();

    let ids = (&f.session, f.session_dir.as_path());
    let (restored, saved) = checkpoints
        .overlay_turn(&f.store, ids, (&turn, &f.workspace), true)
        .await
        .unwrap()
        .expect("the turn has a checkpoint");
    assert_eq!(restored.turn_id.as_deref(), Some(turn.as_str()));
    let mut expected = at_turn;
    expected.insert("target/build.out".into(), b"ignored".to_vec());
    expected.insert("big.bin".into(), vec![7; 100]);
    expected.insert("nested/kept.txt".into(), b"a repository of its own".to_vec());
    let outside_nested_git = |files: BTreeMap<String, Vec<u8>>| -> BTreeMap<String, Vec<u8>> {
        files.into_iter().filter(|(path, _)| !path.starts_with("nested/.git/")).collect()
    };
    assert_eq!(
        outside_nested_git(files_of(&f.workspace)),
        expected,
        "the turn's files; ignored, big ones and a nested repository kept"
    );
    // What it held is in a checkpoint of its own, restorable (but the big file).
    let saved = saved.expect("saved first");
    assert_eq!(saved.trigger, CheckpointTrigger::Restore);
    let out = tempfile::tempdir().unwrap();
    let into = out.path().join("before");
    checkpoints
        .restore_into(&f.store, f.session.clone(), &f.session_dir, saved.seq, &into)
        .await
        .unwrap();
    let mut held = before;
    held.remove("target/build.out");
    held.remove("big.bin");
    held.remove("nested/kept.txt");
    assert_eq!(files_of(&into), held);
    // A turn without a checkpoint changes nothing.
    let other = f.turn().await;
    let none = checkpoints.overlay_turn(&f.store, ids, (&other, &f.workspace), true).await.unwrap();
    assert!(none.is_none());
    assert_eq!(outside_nested_git(files_of(&f.workspace)), expected);
}
