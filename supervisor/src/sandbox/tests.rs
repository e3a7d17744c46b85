//! What confines an agent, decided from its profile, its runtime and where it runs.

use super::*;
use std::sync::Arc;

fn resolver(bwrap: bool) -> crate::sidecar::Resolver {
    Arc::new(move |name| (bwrap && name == "bwrap").then(|| vec![OsString::from("/usr/bin/bwrap")]))
}

fn words(argv: &[OsString]) -> Vec<&str> {
    argv.iter().map(|arg| arg.to_str().unwrap()).collect()
}

/// The positions of `option` `a` `b` in `argv` (one per occurrence).
fn mounts(argv: &[&str], option: &str) -> Vec<(String, String)> {
    argv.windows(3).filter(|w| w[0] == option).map(|w| (w[1].to_owned(), w[2].to_owned())).collect()
}

fn place(dir: &Path) -> Place {
    Place {
        workspace: dir.join("work"),
        git_dir: Some(dir.join("repo/.git")),
        home: Some(dir.join("home")),
        agent_state: vec![(dir.join("agent-state/s1/.claude"), ".claude".into())],
        argv: vec![dir.join("tools/node_modules/.bin/agent").into(), "--acp".into()],
        agentctl: vec![dir.join("bin/supervisor").into(), "agentctl".into()],
        state_dir: dir.join("sessions/s1/agentctl"),
        env: vec![("ANTHROPIC_BASE_URL".into(), "http://127.0.0.1:8080".into())],
    }
}

#[test]
fn an_unconfined_profile_runs_as_it_is() {
    assert_eq!(check(&SandboxSettings::default(), "docker", &resolver(false)), Ok(()));
}

#[test]
fn an_agent_is_never_run_unconfined_when_its_profile_asks_for_confinement() {
    let none = SandboxSettings { network: NetworkAccess::None, ..SandboxSettings::default() };
    let err = check(&none, "kubernetes", &resolver(true)).unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains("network = \"none\"") && said.contains("the kubernetes runtime"),
        "{said}"
    );
    assert_eq!(check(&none, "docker", &resolver(false)), Ok(()), "a container needs no bwrap");
    assert!(said.contains("never run unconfined"), "{said}");
    let err = check(&none, "standalone", &resolver(false)).unwrap_err();
    assert_eq!(err, SandboxError::NoBwrap);
    assert!(err.to_string().contains("apt-get install bubblewrap"), "{err}");
    assert_eq!(check(&none, "standalone", &resolver(true)), Ok(()));
}

#[test]
fn no_network_with_the_host_file_system_is_namespaces_of_its_own() {
    let none = SandboxSettings { network: NetworkAccess::None, ..SandboxSettings::default() };
    let dir = Path::new("/nowhere");
    let argv = bwrap::argv(vec!["/usr/bin/bwrap".into()], &none, &place(dir), false);
    assert_eq!(
        words(&argv),
        [
            "/usr/bin/bwrap",
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-net",
            "--dev-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--"
        ]
    );
}

#[test]
fn a_workspace_sandbox_binds_the_workspace_its_state_and_what_its_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let package = dir.join("tools/node_modules/agent/dist");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(package.join("index.js"), "").unwrap();
    std::fs::create_dir_all(dir.join("tools/node_modules/.bin")).unwrap();
    std::os::unix::fs::symlink(package.join("index.js"), dir.join("tools/node_modules/.bin/agent"))
        .unwrap();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::write(dir.join("bin/supervisor"), "").unwrap();
    let sandbox = SandboxSettings {
        filesystem: FilesystemAccess::Workspace,
        network: NetworkAccess::Allowlist,
        readable: vec!["~/.config/agent".into()],
        writable: vec!["/srv/cache".into()],
        ..SandboxSettings::default()
    };
    let place = place(&dir);
    let argv = bwrap::argv(vec!["/usr/bin/bwrap".into()], &sandbox, &place, true);
    let argv = words(&argv);
    let path = |p: &str| dir.join(p).to_str().unwrap().to_owned();
    let same = |p: &str| (path(p), path(p));
    assert!(argv.contains(&"--unshare-net"));
    assert!(!argv.contains(&"--dev-bind"), "nothing of the host's root: {argv:?}");
    assert!(mounts(&argv, "--ro-bind-try").contains(&("/usr".into(), "/usr".into())));
    let read_only = mounts(&argv, "--ro-bind");
    assert!(read_only.contains(&same("tools/node_modules")), "its package tree: {argv:?}");
    assert!(read_only.contains(&same("bin/supervisor")), "the relay's binary: {argv:?}");
    assert!(mounts(&argv, "--ro-bind-try").contains(&same("home/.config/agent")));
    assert!(mounts(&argv, "--bind-try").contains(&("/srv/cache".into(), "/srv/cache".into())));
    let read_write = mounts(&argv, "--bind");
    assert!(read_write.contains(&same("work")) && read_write.contains(&same("repo/.git")));
    assert!(read_write.contains(&(path("agent-state/s1/.claude"), path("home/.claude"))));
    // Nothing of agentctl's state dir: the relay reaches the proxy through a descriptor.
    assert!(!argv.iter().any(|word| word.contains("sessions/s1")), "{argv:?}");
    // The home is empty but for what is bound into it, after it.
    let home_at = argv.windows(2).position(|w| w == ["--tmpfs", path("home").as_str()]).unwrap();
    let state_at = argv.iter().position(|w| *w == path("agent-state/s1/.claude")).unwrap();
    assert!(home_at < state_at, "{argv:?}");
    // Then the relay, then the agent's argv goes after the last `--`.
    let tail = &argv[argv.iter().position(|w| *w == "--").unwrap()..];
    assert_eq!(
        tail,
        [
            "--",
            path("bin/supervisor").as_str(),
            "agentctl",
            "relay",
            "--socket",
            "/proc/self/fd/3",
            "--listen",
            PROXY_INSIDE,
            "--"
        ]
    );
}

#[tokio::test]
async fn an_allowlisted_agent_gets_the_proxy_and_its_model_endpoint() {
    let sandbox = SandboxSettings {
        network: NetworkAccess::Allowlist,
        allow: vec!["registry.npmjs.org:443".into()],
        ..SandboxSettings::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let place = place(dir.path());
    let confined = match confine(&sandbox, "standalone", &resolver_on_path(), &place).await {
        Ok(confined) => confined,
        Err(SandboxError::NoBwrap) => return println!("SKIPPED: no bubblewrap here"),
        Err(err) => panic!("{err}"),
    };
    let egress = confined.egress.expect("a proxy");
    assert_eq!(egress.socket, place.state_dir.join("egress.sock"));
    assert_eq!(egress.allow, ["registry.npmjs.org:443", "127.0.0.1:8080"]);
    let env: std::collections::BTreeMap<_, _> = confined.env.into_iter().collect();
    assert_eq!(env["https_proxy"], format!("http://{PROXY_INSIDE}"));
    assert_eq!(env["HTTP_PROXY"], format!("http://{PROXY_INSIDE}"));
    assert_eq!(env["NO_PROXY"], "", "loopback goes through the proxy too");
}

#[tokio::test]
async fn a_bubblewrap_that_cannot_make_a_sandbox_fails_the_start_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("bwrap");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let resolve: crate::sidecar::Resolver = {
        let fake = fake.clone();
        Arc::new(move |name| (name == "bwrap").then(|| vec![fake.clone().into_os_string()]))
    };
    let none = SandboxSettings { network: NetworkAccess::None, ..SandboxSettings::default() };
    let err = confine(&none, "standalone", &resolve, &place(dir.path())).await.unwrap_err();
    let said = err.to_string();
    assert!(said.contains("No permissions to create new namespace"), "{said}");
    assert!(said.contains("kernel.unprivileged_userns_clone=1"), "the fix: {said}");
    assert!(said.contains("never run unconfined"), "{said}");
}

/// bubblewrap where `PATH` has it.
fn resolver_on_path() -> crate::sidecar::Resolver {
    Arc::new(|name| {
        let path = std::env::var_os("PATH")?;
        let found = std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file());
        found.map(|program| vec![program.into_os_string()])
    })
}

#[tokio::test]
async fn in_a_container_agentctl_makes_the_namespace_and_the_relay_is_its_binary() {
    let sandbox = SandboxSettings {
        filesystem: FilesystemAccess::Workspace,
        network: NetworkAccess::Allowlist,
        allow: vec!["172.17.0.1:8080".into()],
        ..SandboxSettings::default()
    };
    let place = Place { argv: vec!["mock-agent".into()], ..Place::default() };
    let confined = confine(&sandbox, "docker", &resolver(false), &place).await.unwrap();
    assert!(confined.isolate_network);
    assert_eq!(
        words(&confined.argv),
        [
            "/tether/agentctl",
            "relay",
            "--socket",
            "/proc/self/fd/3",
            "--listen",
            PROXY_INSIDE,
            "--",
            "mock-agent"
        ]
    );
    let egress = confined.egress.unwrap();
    assert_eq!(egress.socket, Path::new("/tether/state/egress.sock"), "agentctl's, inside");
    assert_eq!(egress.allow, ["172.17.0.1:8080"]);
    let none = SandboxSettings { network: NetworkAccess::None, ..SandboxSettings::default() };
    let confined = confine(&none, "docker", &resolver(false), &place).await.unwrap();
    assert!(confined.isolate_network && confined.egress.is_none());
    assert_eq!(words(&confined.argv), ["mock-agent"]);
}
