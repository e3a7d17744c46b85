//! What a container runs and needs: the static agentctl binary (where it is looked for),
//! the entrypoint archive copied in, the sidecar's TLS certificate and private files.

use super::{Path, PathBuf, RuntimeError};

/// The places a statically linked agentctl is looked for when none is configured, in
/// order: beside the daemon's binary (`agentctl-static`, an installed layout); the cargo
/// target layout the daemon runs from (`target/<profile>/supervisor` →
/// `target/x86_64-unknown-linux-gnu/<profile>/agentctl`, then the other profile), where
/// `scripts/build-static.sh` puts it; `$TETHER_HOME/bin/agentctl`.
pub fn static_agentctl_candidates(exe_dir: &Path, home: &Path) -> Vec<PathBuf> {
    let mut candidates = vec![exe_dir.join("agentctl-static")];
    if let (Some(profile), Some(target)) = (exe_dir.file_name(), exe_dir.parent()) {
        let static_dir = target.join("x86_64-unknown-linux-gnu");
        candidates.push(static_dir.join(profile).join("agentctl"));
        for other in ["release", "debug"] {
            if profile != other {
                candidates.push(static_dir.join(other).join("agentctl"));
            }
        }
    }
    candidates.push(home.join("bin").join("agentctl"));
    candidates
}

/// The first of `candidates` that is a statically linked ELF executable (no program
/// interpreter: it runs in any image, `FROM scratch` included).
pub fn find_static_agentctl(candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates.iter().find(|path| is_static_elf(path)).cloned()
}

/// Whether `path` is a 64-bit little-endian ELF file without a `PT_INTERP` program header
/// (a dynamically linked one names its loader there).
pub fn is_static_elf(path: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    const PT_INTERP: u32 = 3;
    let Ok(file) = std::fs::File::open(path) else { return false };
    let mut header = [0u8; 64];
    if file.read_exact_at(&mut header, 0).is_err()
        || &header[..4] != b"\x7fELF"
        || header[4] != 2
        || header[5] != 1
    {
        return false;
    }
    let phoff = u64::from_le_bytes(header[0x20..0x28].try_into().expect("UNWRAP: 8 bytes"));
    let phentsize = u64::from(u16::from_le_bytes([header[0x36], header[0x37]]));
    let phnum = u64::from(u16::from_le_bytes([header[0x38], header[0x39]]));
    if phentsize < 4 {
        return false;
    }
    (0..phnum).all(|index| {
        let mut kind = [0u8; 4];
        file.read_exact_at(&mut kind, phoff + index * phentsize).is_ok()
            && u32::from_le_bytes(kind) != PT_INTERP
    })
}

/// A tar archive (extracted at `/`) of `tether/agentctl` and the secrets in
/// `tether/secrets/` (`(name, text, mode)`): what a container on an engine that mounts
/// nothing of the supervisor's host needs before it starts.
pub(super) fn entrypoint_archive(
    agentctl: &Path,
    secrets: &[(&str, String, u32)],
) -> Result<Vec<u8>, RuntimeError> {
    let binary = std::fs::read(agentctl)
        .map_err(|err| RuntimeError::Unavailable(format!("{}: {err}", agentctl.display())))?;
    let mut tar = tar::Builder::new(Vec::new());
    let mut entry = |path: &str, bytes: &[u8], mode: u32, kind: tar::EntryType| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(bytes.len() as u64);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_cksum();
        tar.append_data(&mut header, path, bytes)
            .map_err(|err| RuntimeError::Engine(format!("building the archive: {err}")))
    };
    entry("tether/", &[], 0o755, tar::EntryType::Directory)?;
    entry("tether/agentctl", &binary, 0o755, tar::EntryType::Regular)?;
    entry("tether/secrets/", &[], 0o700, tar::EntryType::Directory)?;
    for (name, text, mode) in secrets {
        entry(&format!("tether/secrets/{name}"), text.as_bytes(), *mode, tar::EntryType::Regular)?;
    }
    tar.into_inner().map_err(|err| RuntimeError::Engine(format!("building the archive: {err}")))
}

/// A self-signed certificate and its key (PEM) for one execution's control channel, named
/// for the address it is reached at.
pub fn sidecar_certificate(address: std::net::IpAddr) -> Result<(String, String), RuntimeError> {
    let failed = |err: rcgen::Error| {
        RuntimeError::Engine(format!("cannot make the sidecar's certificate: {err}"))
    };
    let key = rcgen::KeyPair::generate().map_err(failed)?;
    let params = rcgen::CertificateParams::new(vec![address.to_string()]).map_err(failed)?;
    let cert = params.self_signed(&key).map_err(failed)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes `name` in the state dir, readable by its owner only.
pub(super) fn write_private(state_dir: &Path, name: &str, text: &str) -> Result<(), RuntimeError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let io = |err: std::io::Error| RuntimeError::Engine(format!("{}: {err}", state_dir.display()));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(state_dir).map_err(io)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(state_dir.join(name))
        .map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_agentctl_is_looked_for_where_the_scripts_put_it() {
        let candidates =
            static_agentctl_candidates(Path::new("/src/tether/target/release"), Path::new("/h"));
        let shown: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            shown,
            [
                "/src/tether/target/release/agentctl-static",
                "/src/tether/target/x86_64-unknown-linux-gnu/release/agentctl",
                "/src/tether/target/x86_64-unknown-linux-gnu/debug/agentctl",
                "/h/bin/agentctl",
            ]
        );
    }

    #[test]
    fn only_a_static_elf_is_taken() {
        // The test binary itself is dynamically linked (it names its loader), and a text
        // file is no ELF at all.
        let this = std::env::current_exe().unwrap();
        assert!(!is_static_elf(&this));
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("agentctl");
        std::fs::write(&text, "#!/bin/sh\n").unwrap();
        assert!(!is_static_elf(&text));
        assert!(!is_static_elf(&dir.path().join("missing")));
        assert_eq!(find_static_agentctl(&[text, this]), None);
    }
}
