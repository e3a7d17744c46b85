//! A workspace copied to an engine (`workspace = "copy"`): filled, when the session's
//! volume there is new, from its newest checkpoint (`git archive` of it) or, for a session
//! without one yet, from the supervisor's directory; and fetched back as a tar archive
//! (Docker's archive of the directory in the container, running or stopped) for the
//! session's checkpoints.

use std::path::Path;

use bollard::Docker;
use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::engine_error;
use crate::runtime::{RuntimeError, WorkspaceSeed};

/// The seed's files as a tar archive, paths relative to the workspace.
async fn seed_archive(seed: &WorkspaceSeed, workspace: &Path) -> Result<Vec<u8>, RuntimeError> {
    let failed = |err: String| RuntimeError::Engine(format!("the workspace to copy in: {err}"));
    if let Some(commit) = &seed.commit {
        let repo = crate::checkpoint::git::Repo::open(&seed.repo)
            .await
            .map_err(|err| failed(err.to_string()))?;
        return repo.archive(commit).await.map_err(|err| failed(err.to_string()));
    }
    let dir = workspace.to_owned();
    let built = tokio::task::spawn_blocking(move || {
        let mut tar = tar::Builder::new(Vec::new());
        tar.follow_symlinks(false);
        tar.append_dir_all(".", &dir)?;
        tar.into_inner()
    });
    built
        .await
        .map_err(|err| failed(err.to_string()))?
        .map_err(|err| failed(format!("{}: {err}", workspace.display())))
}

/// Fills the (new, empty) workspace volume of container `id` at `workspace`.
pub(super) async fn upload_seed(
    docker: &Docker,
    id: &str,
    seed: &WorkspaceSeed,
    workspace: &Path,
) -> Result<(), RuntimeError> {
    let archive = seed_archive(seed, workspace).await?;
    let options =
        UploadToContainerOptions { path: workspace.display().to_string(), ..Default::default() };
    docker
        .upload_to_container(id, Some(options), bollard::body_full(archive.into()))
        .await
        .map_err(engine_error)
}

/// Writes Docker's tar archive of `path` in container `container` into the file `to`.
pub(super) async fn download(
    docker: &Docker,
    container: &str,
    path: &Path,
    to: &Path,
) -> Result<(), RuntimeError> {
    let io = |err: std::io::Error| RuntimeError::Engine(format!("{}: {err}", to.display()));
    let mut file = tokio::fs::File::create(to).await.map_err(io)?;
    let options = DownloadFromContainerOptions { path: path.display().to_string() };
    let mut stream = docker.download_from_container(container, Some(options));
    while let Some(chunk) = stream.next().await {
        file.write_all(&chunk.map_err(engine_error)?).await.map_err(io)?;
    }
    file.flush().await.map_err(io)
}
