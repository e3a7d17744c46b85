//! The supervisor's copy of a workspace that lives elsewhere (in a volume on a Docker
//! engine with `workspace = "copy"`), kept in step from a tar archive of it, from which
//! its checkpoints are taken. What the archive holds is written — a file whose size and
//! time are unchanged is left alone, so the checkpoint's index finds it unchanged and
//! does not hash it again — and what it no longer holds is removed. The archive comes
//! from another machine: an entry that would land outside the copy (an absolute path,
//! `..`, or through a symbolic link) is refused, and nothing but files, directories and
//! symbolic links is made (a hard link's second name becomes a copy).

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use super::CheckpointError;

/// What a sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Synced {
    /// The files (and links) the archive holds.
    pub files: u64,
    /// Those written (new or changed).
    pub written: u64,
    /// Files and directories removed (gone from the archive).
    pub removed: u64,
}

fn io(what: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |err| CheckpointError::Io(format!("{}: {err}", what.display()))
}

/// An entry's path inside the copy: its first component (the workspace's own name, as
/// Docker's archive of a directory names it) dropped; `None` for that root itself.
fn inside(path: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    let mut relative = PathBuf::new();
    for (index, component) in path.components().enumerate() {
        match component {
            Component::Normal(part) if index > 0 => relative.push(part),
            Component::Normal(_) | Component::CurDir => {}
            _ => {
                return Err(CheckpointError::Refused(format!(
                    "the workspace's archive names {}, outside the workspace",
                    path.display()
                )));
            }
        }
    }
    Ok((!relative.as_os_str().is_empty()).then_some(relative))
}

/// Makes `into`/`relative` a real directory, and every directory on the way: whatever
/// stands there instead (a file, a symbolic link) is removed first, so nothing is
/// written through a link.
fn real_dirs(into: &Path, relative: &Path) -> Result<(), CheckpointError> {
    let mut at = into.to_path_buf();
    for part in relative.components() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => std::fs::remove_file(&at).map_err(io(&at))?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(io(&at)(err)),
        }
        std::fs::create_dir(&at).map_err(io(&at))?;
    }
    Ok(())
}

/// Removes whatever is at `path` unless it is a plain file (a directory, a link).
fn clear_for_file(path: &Path) -> Result<(), CheckpointError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path).map_err(io(path)),
        Ok(meta) if meta.file_type().is_symlink() => std::fs::remove_file(path).map_err(io(path)),
        _ => Ok(()),
    }
}

/// Whether the file at `path` has this size and modification time (whole seconds).
fn unchanged(path: &Path, size: u64, mtime: u64) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| {
        meta.is_file()
            && meta.len() == size
            && meta
                .modified()
                .ok()
                .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
                .is_some_and(|at| at.as_secs() == mtime)
    })
}

/// Writes one regular file from the archive (its mode's permission bits and its time).
fn write_file(
    entry: &mut tar::Entry<'_, impl Read>,
    target: &Path,
    mtime: u64,
) -> Result<(), CheckpointError> {
    use std::os::unix::fs::PermissionsExt;
    clear_for_file(target)?;
    // Made anew: a read-only file of the last sync would refuse to be truncated.
    let _ = std::fs::remove_file(target);
    let mut file = std::fs::File::create(target).map_err(io(target))?;
    std::io::copy(entry, &mut file).map_err(io(target))?;
    let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
    file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(io(target))?;
    file.set_modified(UNIX_EPOCH + Duration::from_secs(mtime)).map_err(io(target))
}

/// Makes `target` a symbolic link to `link` (unless it is one already).
fn write_link(link: &Path, target: &Path) -> Result<(), CheckpointError> {
    if std::fs::read_link(target).is_ok_and(|now| now == link) {
        return Ok(());
    }
    clear_for_file(target)?;
    let _ = std::fs::remove_file(target);
    std::os::unix::fs::symlink(link, target).map_err(io(target))
}

/// Brings `into` in step with `archive` (see the module doc).
pub fn sync_from_tar(archive: impl Read, into: &Path) -> Result<Synced, CheckpointError> {
    std::fs::create_dir_all(into).map_err(io(into))?;
    let mut synced = Synced::default();
    let mut seen = BTreeSet::new();
    let bad = |err: std::io::Error| {
        CheckpointError::Refused(format!("the workspace's archive cannot be read: {err}"))
    };
    let mut tar = tar::Archive::new(archive);
    for entry in tar.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let path = entry.path().map_err(bad)?.into_owned();
        let Some(relative) = inside(&path)? else { continue };
        let parent = relative.parent().unwrap_or(Path::new(""));
        let target = into.join(&relative);
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            real_dirs(into, &relative)?;
        } else if kind.is_file() {
            real_dirs(into, parent)?;
            let (size, mtime) = (entry.size(), entry.header().mtime().map_err(bad)?);
            synced.files += 1;
            if !unchanged(&target, size, mtime) {
                write_file(&mut entry, &target, mtime)?;
                synced.written += 1;
            }
        } else if kind.is_symlink() {
            let Some(link) = entry.link_name().map_err(bad)? else { continue };
            real_dirs(into, parent)?;
            synced.files += 1;
            write_link(&link, &target)?;
        } else if kind == tar::EntryType::Link {
            // A second name of a file written before it: a copy of that file.
            let Some(link) = entry.link_name().map_err(bad)? else { continue };
            let Some(first) = inside(&link)? else { continue };
            real_dirs(into, parent)?;
            clear_for_file(&target)?;
            let _ = std::fs::remove_file(&target);
            std::fs::copy(into.join(&first), &target).map_err(io(&target))?;
            synced.files += 1;
            synced.written += 1;
        } else {
            // Devices, fifos: not workspace content a checkpoint keeps.
            continue;
        }
        seen.extend(relative.ancestors().map(Path::to_path_buf));
    }
    remove_unseen(into, Path::new(""), &seen, &mut synced.removed)?;
    Ok(synced)
}

/// Removes, under `into`/`dir`, everything the archive did not name.
fn remove_unseen(
    into: &Path,
    dir: &Path,
    seen: &BTreeSet<PathBuf>,
    removed: &mut u64,
) -> Result<(), CheckpointError> {
    let here = into.join(dir);
    for entry in std::fs::read_dir(&here).map_err(io(&here))? {
        let entry = entry.map_err(io(&here))?;
        let relative = dir.join(entry.file_name());
        let path = entry.path();
        let is_dir = entry.file_type().map_err(io(&path))?.is_dir();
        if !seen.contains(&relative) {
            let gone =
                if is_dir { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            gone.map_err(io(&path))?;
            *removed += 1;
        } else if is_dir {
            remove_unseen(into, &relative, seen, removed)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// An archive as Docker makes one of a directory: every entry under its name.
    fn archive(entries: &[(&str, Option<&str>, u64)], links: &[(&str, &str)]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let mut root = tar::Header::new_gnu();
        root.set_entry_type(tar::EntryType::Directory);
        root.set_mode(0o755);
        root.set_size(0);
        tar.append_data(&mut root, "ws/", std::io::empty()).unwrap();
        for (path, text, mtime) in entries {
            let mut header = tar::Header::new_gnu();
            match text {
                Some(text) => {
                    header.set_size(text.len() as u64);
                    header.set_mode(0o644);
                    header.set_mtime(*mtime);
                    tar.append_data(&mut header, format!("ws/{path}"), text.as_bytes()).unwrap();
                }
                None => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    header.set_size(0);
                    tar.append_data(&mut header, format!("ws/{path}/"), std::io::empty()).unwrap();
                }
            }
        }
        for (path, to) in links {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            tar.append_link(&mut header, format!("ws/{path}"), to).unwrap();
        }
        tar.into_inner().unwrap()
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn a_copy_follows_the_archive_writing_only_what_changed_and_removing_what_went() {
        let dir = tempfile::tempdir().unwrap();
        let into = dir.path().join("copy");
        let first = archive(
            &[
                ("a.txt", Some("alpha"), 1_000),
                ("src", None, 0),
                ("src/b.rs", Some("fn b() {}"), 1_000),
                ("old/gone.txt", Some("bye"), 1_000),
            ],
            &[("link", "a.txt")],
        );
        let synced = sync_from_tar(first.as_slice(), &into).unwrap();
        assert_eq!(synced, Synced { files: 4, written: 3, removed: 0 });
        assert_eq!(read(&into.join("a.txt")), "alpha");
        assert_eq!(read(&into.join("src/b.rs")), "fn b() {}");
        assert_eq!(std::fs::read_link(into.join("link")).unwrap(), Path::new("a.txt"));
        let inode = std::fs::metadata(into.join("a.txt")).unwrap().ino();

        // b.rs changed, c.txt is new, old/ is gone; a.txt (same size, same time) is left.
        let second = archive(
            &[
                ("a.txt", Some("alpha"), 1_000),
                ("src/b.rs", Some("fn b() { 1 }"), 2_000),
                ("c.txt", Some("gamma"), 2_000),
            ],
            &[("link", "c.txt")],
        );
        std::fs::write(into.join("stray.txt"), "not in the archive").unwrap();
        let synced = sync_from_tar(second.as_slice(), &into).unwrap();
        assert_eq!(synced, Synced { files: 4, written: 2, removed: 2 });
        assert_eq!(std::fs::metadata(into.join("a.txt")).unwrap().ino(), inode, "rewritten");
        assert_eq!(read(&into.join("src/b.rs")), "fn b() { 1 }");
        assert_eq!(read(&into.join("c.txt")), "gamma");
        assert_eq!(std::fs::read_link(into.join("link")).unwrap(), Path::new("c.txt"));
        assert!(!into.join("old").exists() && !into.join("stray.txt").exists());
        let modified = std::fs::metadata(into.join("c.txt")).unwrap().modified().unwrap();
        assert_eq!(modified, UNIX_EPOCH + Duration::from_secs(2_000), "the archive's time");
    }

    #[test]
    fn a_hard_link_becomes_a_copy_and_a_read_only_file_is_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let into = dir.path().join("copy");
        let first = archive(&[("ro.txt", Some("old"), 1)], &[]);
        sync_from_tar(first.as_slice(), &into).unwrap();
        let read_only = std::fs::Permissions::from_mode(0o444);
        std::fs::set_permissions(into.join("ro.txt"), read_only).unwrap();
        // ro.txt changed; again.txt is a second name of it (a hard link entry).
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(3);
        header.set_mode(0o644);
        header.set_mtime(2);
        tar.append_data(&mut header, "ws/ro.txt", "new".as_bytes()).unwrap();
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Link);
        link.set_size(0);
        tar.append_link(&mut link, "ws/again.txt", "ws/ro.txt").unwrap();
        let second = tar.into_inner().unwrap();
        let synced = sync_from_tar(second.as_slice(), &into).unwrap();
        assert_eq!(synced.files, 2);
        assert_eq!(read(&into.join("ro.txt")), "new");
        assert_eq!(read(&into.join("again.txt")), "new");
    }

    #[test]
    fn an_archive_naming_a_path_outside_the_copy_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let into = dir.path().join("copy");
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        let name = b"ws/../../escaped.txt";
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.set_size(3);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append(&header, "bad".as_bytes()).unwrap();
        let refused = sync_from_tar(tar.into_inner().unwrap().as_slice(), &into);
        assert!(matches!(refused, Err(CheckpointError::Refused(_))), "{refused:?}");
        assert!(!dir.path().join("escaped.txt").exists());
    }

    #[test]
    fn a_file_under_a_linked_directory_is_written_inside_the_copy_not_through_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let (into, outside) = (dir.path().join("copy"), dir.path().join("outside"));
        std::fs::create_dir(&outside).unwrap();
        let linked = archive(&[], &[("sub", outside.to_str().unwrap())]);
        sync_from_tar(linked.as_slice(), &into).unwrap();
        let through = archive(&[("sub/x.txt", Some("mine"), 5)], &[]);
        sync_from_tar(through.as_slice(), &into).unwrap();
        assert_eq!(read(&into.join("sub/x.txt")), "mine");
        assert!(std::fs::symlink_metadata(into.join("sub")).unwrap().is_dir());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "written through the link");
    }
}
