//! `fs/read_text_file` and `fs/write_text_file`, served by agentctl beside the agent's
//! files and confined to the session's workspace roots.
//!
//! Confinement: the path must be absolute and free of `..`; it is then resolved through
//! every symlink (for a new file, through its nearest existing ancestor) and must land
//! inside one of the canonical roots. A symlink that points out of the workspace is refused
//! like any other outside path.

use std::io;
use std::path::{Component, Path, PathBuf};

use protocol::{ErrorCode, RpcError};
use serde::Deserialize;
use serde_json::{Value, json};

/// Whose file access an `fs/*` request gets: the agent's own user's (a profile's
/// `process.user`), not agentctl's — agentctl may be root, and the agent must not reach
/// through it what it cannot open itself.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The agent's uid.
    pub uid: nix::unistd::Uid,
    /// Its primary gid.
    pub gid: nix::unistd::Gid,
    /// Its supplementary groups.
    pub groups: Vec<nix::unistd::Gid>,
}

impl Identity {
    /// Runs `op` on a thread of its own that takes this identity for file access first
    /// (`setfsuid`, `setfsgid` and the groups, which Linux keeps per thread); the thread
    /// ends with the request, so no other work ever runs with it.
    pub fn run<T: Send>(
        &self,
        op: impl FnOnce() -> Result<T, FsError> + Send,
    ) -> Result<T, FsError> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    self.assume()?;
                    op()
                })
                .join()
                .unwrap_or_else(|_| Err(FsError::Params("the file access thread failed".into())))
        })
    }

    fn assume(&self) -> Result<(), FsError> {
        let failed = |what: &str, source: io::Error| FsError::Io {
            path: PathBuf::from(format!("(taking the agent's {what})")),
            source,
        };
        let groups: Vec<nix::libc::gid_t> = self.groups.iter().map(|gid| gid.as_raw()).collect();
        // SAFETY: the raw system call changes this thread's groups only (glibc's wrapper
        // would change every thread's); `groups` outlives the call.
        let set =
            unsafe { nix::libc::syscall(nix::libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
        if set != 0 {
            return Err(failed("groups", io::Error::last_os_error()));
        }
        nix::unistd::setfsgid(self.gid);
        nix::unistd::setfsuid(self.uid);
        // Both return the previous ids whatever happens: read back to know it took.
        let (gid, uid) = (nix::unistd::setfsgid(self.gid), nix::unistd::setfsuid(self.uid));
        if (gid, uid) != (self.gid, self.uid) {
            return Err(failed("user", io::Error::from(io::ErrorKind::PermissionDenied)));
        }
        Ok(())
    }
}

/// The largest file served, so that one request cannot exhaust memory.
pub const MAX_READ_BYTES: u64 = 16 * 1024 * 1024;

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// Not an absolute path.
    #[error("path {0} is not absolute")]
    Relative(PathBuf),
    /// The path has a `..` component.
    #[error("path {0} contains '..'")]
    DotDot(PathBuf),
    /// The path resolves outside every workspace root.
    #[error("path {0} is outside the workspace")]
    Outside(PathBuf),
    /// The file does not exist. Said as ACP's resource-not-found (`-32002`, "Resource not
    /// found", `data.uri`): agents recognise a missing file by that code (qwen) or those
    /// words (gemini-cli matches "Resource not found", "ENOENT", "No such file"), and a new
    /// file's write begins with a read that must fail that way.
    #[error("Resource not found: {0} (no such file)")]
    NotFound(PathBuf),
    /// The file is larger than [`MAX_READ_BYTES`].
    #[error("file {0} is larger than {MAX_READ_BYTES} bytes")]
    TooLarge(PathBuf),
    /// The file is not UTF-8 text.
    #[error("file {0} is not UTF-8 text")]
    NotText(PathBuf),
    /// Bad params.
    #[error("invalid params: {0}")]
    Params(String),
    /// Another I/O error.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl From<FsError> for RpcError {
    fn from(error: FsError) -> RpcError {
        let code = match &error {
            FsError::NotFound(_) => ErrorCode::ResourceNotFound,
            FsError::Io { .. } => ErrorCode::InternalError,
            _ => ErrorCode::InvalidParams,
        };
        let mut answer = RpcError::new(code, error.to_string());
        if let FsError::NotFound(path) = &error {
            answer.data = Some(json!({"uri": path}));
        }
        answer
    }
}

/// The directories a session's agent may touch, canonicalised.
#[derive(Debug, Clone)]
pub struct Roots {
    roots: Vec<PathBuf>,
}

impl Default for Roots {
    /// No roots: every request is refused.
    fn default() -> Roots {
        Roots { roots: Vec::new() }
    }
}

impl Roots {
    /// Canonicalises each root; each must exist.
    pub fn new(roots: &[PathBuf]) -> io::Result<Roots> {
        let roots = roots.iter().map(std::fs::canonicalize).collect::<io::Result<Vec<_>>>()?;
        Ok(Roots { roots })
    }

    fn check_shape(path: &Path) -> Result<(), FsError> {
        if !path.is_absolute() {
            return Err(FsError::Relative(path.to_owned()));
        }
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(FsError::DotDot(path.to_owned()));
        }
        Ok(())
    }

    fn ensure_inside(&self, requested: &Path, resolved: &Path) -> Result<(), FsError> {
        if self.roots.iter().any(|root| resolved.starts_with(root)) {
            Ok(())
        } else {
            Err(FsError::Outside(requested.to_owned()))
        }
    }

    /// The real path of an existing file inside the roots.
    pub fn resolve_existing(&self, path: &Path) -> Result<PathBuf, FsError> {
        Roots::check_shape(path)?;
        let resolved = std::fs::canonicalize(path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => FsError::NotFound(path.to_owned()),
            _ => FsError::Io { path: path.to_owned(), source },
        })?;
        self.ensure_inside(path, &resolved)?;
        Ok(resolved)
    }

    /// The real path to write: an existing file is resolved like a read; a new one through
    /// its nearest existing ancestor, which must be inside the roots.
    pub fn resolve_for_write(&self, path: &Path) -> Result<PathBuf, FsError> {
        Roots::check_shape(path)?;
        match self.resolve_existing(path) {
            Err(FsError::NotFound(_)) => {}
            other => return other,
        }
        // A dangling symlink must not be followed to a place outside the roots.
        if std::fs::symlink_metadata(path).is_ok() {
            return Err(FsError::Outside(path.to_owned()));
        }
        let mut existing = path.parent();
        let mut missing =
            vec![path.file_name().ok_or_else(|| FsError::Params("the path names no file".into()))?];
        while let Some(dir) = existing {
            if dir.exists() {
                break;
            }
            missing.push(dir.file_name().ok_or_else(|| FsError::Params("bad path".into()))?);
            existing = dir.parent();
        }
        let base = existing.ok_or_else(|| FsError::Outside(path.to_owned()))?;
        let mut resolved = std::fs::canonicalize(base)
            .map_err(|source| FsError::Io { path: base.to_owned(), source })?;
        self.ensure_inside(path, &resolved)?;
        for part in missing.iter().rev() {
            resolved.push(part);
        }
        Ok(resolved)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReadParams {
    path: PathBuf,
    line: Option<u32>,
    limit: Option<u32>,
}

#[derive(Deserialize)]
struct WriteParams {
    path: PathBuf,
    content: String,
}

/// Serves `fs/read_text_file`: the file's text, from `line` (1-based), at most `limit`
/// lines.
pub fn read_text_file(roots: &Roots, params: Option<&Value>) -> Result<Value, FsError> {
    let params: ReadParams = parse(params)?;
    let resolved = roots.resolve_existing(&params.path)?;
    let io = |source| FsError::Io { path: params.path.clone(), source };
    let meta = std::fs::metadata(&resolved).map_err(io)?;
    if meta.len() > MAX_READ_BYTES {
        return Err(FsError::TooLarge(params.path));
    }
    let bytes = std::fs::read(&resolved)
        .map_err(|source| FsError::Io { path: params.path.clone(), source })?;
    let text = String::from_utf8(bytes).map_err(|_| FsError::NotText(params.path.clone()))?;
    let content = match (params.line, params.limit) {
        (None, None) => text,
        (line, limit) => {
            let skip = line.map_or(0, |line| line.saturating_sub(1) as usize);
            let take = limit.map_or(usize::MAX, |limit| limit as usize);
            text.split_inclusive('\n').skip(skip).take(take).collect()
        }
    };
    Ok(json!({"content": content}))
}

/// Serves `fs/write_text_file`, creating missing parent directories inside the roots.
pub fn write_text_file(roots: &Roots, params: Option<&Value>) -> Result<Value, FsError> {
    let params: WriteParams = parse(params)?;
    let resolved = roots.resolve_for_write(&params.path)?;
    let io = |source| FsError::Io { path: params.path.clone(), source };
    if let Some(parent) = resolved.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(&resolved, params.content.as_bytes())
        .map_err(|source| FsError::Io { path: params.path.clone(), source })?;
    Ok(json!({}))
}

fn parse<T: for<'de> Deserialize<'de>>(params: Option<&Value>) -> Result<T, FsError> {
    serde_json::from_value(params.cloned().unwrap_or(Value::Null))
        .map_err(|err| FsError::Params(err.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, tempfile::TempDir, Roots) {
        let work = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(work.path().join("a.txt"), "one\ntwo\nthree\n").unwrap();
        std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), work.path().join("link.txt"))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), work.path().join("out")).unwrap();
        let roots = Roots::new(&[work.path().to_owned()]).unwrap();
        (work, outside, roots)
    }

    fn read(roots: &Roots, path: &Path) -> Result<Value, FsError> {
        read_text_file(roots, Some(&json!({"sessionId": "s", "path": path})))
    }

    #[test]
    fn a_missing_file_is_acps_resource_not_found_in_words_agents_recognise() {
        let (work, _outside, roots) = setup();
        let path = work.path().join("new.txt");
        let error = RpcError::from(read(&roots, &path).unwrap_err());
        assert_eq!(error.code, ErrorCode::ResourceNotFound);
        assert_eq!(error.code.code(), -32002);
        // gemini-cli's test of a missing file, and ACP's own wording.
        assert!(error.message.starts_with("Resource not found"), "{}", error.message);
        assert!(error.message.contains(path.to_str().unwrap()), "{}", error.message);
        assert_eq!(error.data, Some(json!({"uri": path})));
    }

    #[test]
    fn reads_inside_the_roots() {
        let (work, _outside, roots) = setup();
        let path = work.path().join("a.txt");
        assert_eq!(read(&roots, &path).unwrap(), json!({"content": "one\ntwo\nthree\n"}));
        let some = read_text_file(
            &roots,
            Some(&json!({"sessionId": "s", "path": path, "line": 2, "limit": 1})),
        )
        .unwrap();
        assert_eq!(some, json!({"content": "two\n"}));
    }

    #[test]
    fn refuses_escapes() {
        let (work, outside, roots) = setup();
        assert!(matches!(read(&roots, &work.path().join("link.txt")), Err(FsError::Outside(_))));
        assert!(matches!(
            read(&roots, &work.path().join("out/secret.txt")),
            Err(FsError::Outside(_))
        ));
        assert!(matches!(
            read(&roots, &outside.path().join("secret.txt")),
            Err(FsError::Outside(_))
        ));
        assert!(matches!(read(&roots, &work.path().join("../x/a.txt")), Err(FsError::DotDot(_))));
        assert!(matches!(read(&roots, Path::new("a.txt")), Err(FsError::Relative(_))));
        assert!(matches!(
            read(&roots, &work.path().join("missing.txt")),
            Err(FsError::NotFound(_))
        ));
        let write = |path: PathBuf| {
            write_text_file(&roots, Some(&json!({"sessionId": "s", "path": path, "content": "x"})))
        };
        assert!(matches!(write(work.path().join("out/new.txt")), Err(FsError::Outside(_))));
        assert!(matches!(write(work.path().join("link.txt")), Err(FsError::Outside(_))));
        assert_eq!(std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(), "secret");
    }

    #[test]
    fn writes_inside_the_roots_creating_directories() {
        let (work, _outside, roots) = setup();
        let path = work.path().join("new/deeper/b.txt");
        write_text_file(&roots, Some(&json!({"sessionId": "s", "path": path, "content": "hello"})))
            .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello");
    }

    #[test]
    fn errors_map_to_json_rpc_codes() {
        assert_eq!(
            RpcError::from(FsError::NotFound("/x".into())).code,
            ErrorCode::ResourceNotFound
        );
        assert_eq!(RpcError::from(FsError::Outside("/x".into())).code, ErrorCode::InvalidParams);
        assert!(matches!(
            read_text_file(&Roots { roots: vec![] }, Some(&json!({"nopath": 1}))),
            Err(FsError::Params(_))
        ));
    }
}
