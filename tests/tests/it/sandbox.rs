//! Agents in a sandbox, seen from inside a real agent process (mock-agent's `/sh`,
//! `/peek` and `/connect` probes): the workspace sandbox with an egress allowlist, where
//! the "outside" is servers these tests run on loopback; `network = "none"`; and an agent
//! whose profile asks for confinement the runtime cannot give is never run unconfined —
//! `agents` says why it is unavailable, and a session of it is refused with that reason.
//! The proxy's own tests are in `agentctl::egress`, the sandbox's argv in
//! `supervisor::sandbox`.

use std::io::{Read, Write};

use protocol::api::{ApiClient, EventKind};
use protocol::errors::ErrorKind;
use tether_tests::daemon::{Daemon, ok, until};

#[tokio::test]
async fn a_profile_asking_for_confinement_is_never_run_unconfined() {
    // A machine without bubblewrap: the daemon's PATH has none (mock-agent is an applet).
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().to_str().unwrap();
    let confined = "id = \"confined\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
        [sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\nallow = [\"127.0.0.1:9\"]\n";
    let open = "id = \"open\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
        [sandbox]\nfilesystem = \"host\"\nnetwork = \"host\"\n";
    let profiles = [("confined.toml", confined), ("open.toml", open)];
    let daemon = Daemon::start_with_env(&[], &profiles, &[("PATH", path)]).await;
    let api = daemon.api().await;
    let agents = ok("agents.list", api.typed().agents_list()).await;
    let find = |id: &str| agents.iter().find(|a| a.id == id).cloned().expect(id);
    let confined = find("confined");
    assert!(!confined.available, "{confined:?}");
    let said = confined.reasons.join("; ");
    assert!(
        said.contains("needs bubblewrap") && said.contains("apt-get install bubblewrap"),
        "{said}"
    );
    assert!(said.contains("never run unconfined"), "{said}");
    assert!(find("open").available, "host and host is today's behaviour");
    let refused = api.create_session("confined", &daemon.workspace("w")).await.unwrap_err();
    assert_eq!(refused.kind, ErrorKind::AgentUnavailable, "{refused:?}");
    assert!(refused.message.contains("never run unconfined"), "{refused:?}");
    // The same agent, unconfined, runs as before.
    let session = api.ready_session("open", &daemon.workspace("open")).await;
    assert!(api.ask(&session, "hello").await.contains("you said: hello"));
}

/// `network = "none"`: the agent's own connection to a server on this machine fails,
/// while the same agent unconfined reaches it; the agent works otherwise (its turns, its
/// reads of the file system). Needs bubblewrap (`scripts/setup.sh` installs it).
#[tokio::test]
async fn an_agent_without_network_reaches_nothing_and_works_otherwise() {
    if !has_bwrap() {
        return;
    }
    let offline = "id = \"offline\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
        [sandbox]\nnetwork = \"none\"\n";
    let daemon = Daemon::start_with_profiles(&[], &[("offline.toml", offline)]).await;
    let api = daemon.api().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let agents = ok("agents.list", api.typed().agents_list()).await;
    let offline = agents.iter().find(|a| a.id == "offline").expect("offline");
    assert!(offline.available, "{offline:?}");
    let session = api.ready_session("offline", &daemon.workspace("offline")).await;
    // Its own loopback, where nothing listens: the port this test listens on is refused.
    let reply = api.ask(&session, &format!("/connect 127.0.0.1:{port}\nreach out")).await;
    assert!(reply.contains(&format!("connect 127.0.0.1:{port} failed")), "{reply}");
    let secret = daemon.workspace("offline").join("notes.txt");
    std::fs::write(&secret, "kept").unwrap();
    let reply = api.ask(&session, &format!("/peek {}\nread", secret.display())).await;
    assert!(reply.contains("4 bytes"), "the file system is as it was: {reply}");
    let open = api.ready_session("mock", &daemon.workspace("open")).await;
    let reply = api.ask(&open, &format!("/connect 127.0.0.1:{port}\nreach out")).await;
    assert!(reply.contains(&format!("connect 127.0.0.1:{port}: connected")), "{reply}");
}

/// Whether bubblewrap is installed; CI must have it, elsewhere a test without it says it
/// skipped.
fn has_bwrap() -> bool {
    if which_bwrap().is_some() {
        return true;
    }
    assert!(std::env::var_os("REQUIRE_DOCKER").is_none(), "CI must have bubblewrap");
    println!("SKIPPED: bubblewrap is not installed (scripts/setup.sh installs it)");
    false
}

fn which_bwrap() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join("bwrap")).find(|bwrap| bwrap.is_file())
}

/// An "outside" HTTP server on loopback answering every request with `body`; its port.
fn outside(body: &'static str) -> u16 {
    outside_on("127.0.0.1", body)
}

/// [`outside`] on the address `ip` (a container reaches this host at its bridge's gateway).
fn outside_on(ip: &str, body: &'static str) -> u16 {
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    port
}

/// What `/sh COMMAND` said in the agent: its exit status and output (`exit N: …`).
async fn sh(api: &tether_tests::daemon::Api, session: &str, command: &str) -> String {
    let reply = api.ask(session, &format!("/sh {command}\nprobe")).await;
    let said = reply.split_once("; sh ").map(|(_, said)| said.to_owned());
    said.unwrap_or_else(|| panic!("no probe output in {reply:?}"))
}

/// `filesystem = "workspace"` with an egress allowlist, probed from inside the agent:
/// the allowlisted server answers through the proxy; one not on the list is refused, and
/// the refusal is a session event; a direct connection reaches nothing; the data dir,
/// another session's workspace and the home are not there; the workspace is writable.
#[tokio::test]
async fn a_sandboxed_agent_sees_its_workspace_and_reaches_only_its_allowlist() {
    if !has_bwrap() {
        return;
    }
    let allowed = outside("from the allowed server");
    let other = outside("from a server not on the list");
    let profile = format!(
        "id = \"boxed\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
         [env]\nANTHROPIC_BASE_URL = \"http://localhost:4000\"\n\
         [sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\nallow = [\"127.0.0.1:{allowed}\"]\n"
    );
    let daemon = Daemon::start_with_profiles(&[], &[("boxed.toml", &profile)]).await;
    let api = daemon.api().await;
    let elsewhere = daemon.workspace("elsewhere");
    std::fs::write(elsewhere.join("plans.txt"), "another session's").unwrap();
    std::fs::write(daemon.home().join("secret.txt"), "the user's").unwrap();
    let workspace = daemon.workspace("boxed");
    let session = api.ready_session("boxed", &workspace).await;
    let mut events = api.subscribe_at_end(&session).await;
    // What confines it, in its status and in `agents`: its model endpoint is allowlisted
    // by itself.
    let sandbox = api.status(&session).await.sandbox.expect("confined");
    assert_eq!((sandbox.filesystem.as_str(), sandbox.network.as_str()), ("workspace", "allowlist"));
    assert_eq!(sandbox.by.as_deref(), Some("bubblewrap"));
    assert_eq!(sandbox.allow, [format!("127.0.0.1:{allowed}"), "localhost:4000".into()]);
    assert_eq!(sandbox.endpoints, ["localhost:4000"]);
    let (code, listed, _) = daemon.cli(&["agents"]).await;
    assert_eq!(code, 0);
    let expected = format!(
        "sandbox (bubblewrap): filesystem workspace; network allowlist: 127.0.0.1:{allowed}, localhost:4000 (model endpoint)"
    );
    assert!(listed.contains(&expected), "{listed}");
    let (_, shown, _) = daemon.cli(&["status", &session]).await;
    assert!(shown.contains(&expected), "{shown}");

    let through = sh(&api, &session, &format!("curl -sS -m 5 http://127.0.0.1:{allowed}/")).await;
    assert_eq!(through, "exit 0: from the allowed server", "through the proxy");
    let refused = sh(&api, &session, &format!("curl -sS -m 5 http://127.0.0.1:{other}/")).await;
    assert!(refused.contains("not on this session's egress allowlist"), "{refused}");
    let target = format!("127.0.0.1:{other}");
    let seen =
        until(&mut events, |event| matches!(&event.kind, EventKind::EgressRefused { .. })).await;
    let EventKind::EgressRefused { target: said, .. } = &seen.last().unwrap().kind else {
        unreachable!()
    };
    assert_eq!(said, &target);
    let tls = sh(&api, &session, &format!("curl -sS -m 5 https://{target}/")).await;
    assert!(tls.contains("403"), "a CONNECT is refused too: {tls}");
    let direct =
        sh(&api, &session, &format!("curl -sS -m 5 --noproxy '*' http://127.0.0.1:{allowed}/"))
            .await;
    assert!(direct.starts_with("exit 7"), "no route but the proxy: {direct}");

    let data = daemon.data_dir().join("state.db");
    assert!(data.exists());
    for hidden in [data, elsewhere.join("plans.txt"), daemon.home().join("secret.txt")] {
        let reply = api.ask(&session, &format!("/peek {}\nlook", hidden.display())).await;
        assert!(
            reply.contains("No such file or directory"),
            "{} is there: {reply}",
            hidden.display()
        );
    }
    let wrote = sh(&api, &session, "echo made here > made.txt && cat made.txt").await;
    assert_eq!(wrote, "exit 0: made here");
    assert_eq!(std::fs::read_to_string(workspace.join("made.txt")).unwrap(), "made here\n");
    let shared = std::env::temp_dir().join(format!("tether-sandbox-{}", std::process::id()));
    std::fs::write(&shared, "on the host's /tmp").unwrap();
    let tmp = sh(&api, &session, &format!("cat {}", shared.display())).await;
    std::fs::remove_file(&shared).unwrap();
    assert!(tmp.starts_with("exit 1:") && tmp.contains("No such file"), "a private /tmp: {tmp}");
}

/// A `setsid` grandchild of a sandboxed agent shares its namespaces and dies with the
/// session.
#[tokio::test]
async fn a_sandboxed_agents_setsid_grandchild_is_confined_and_killed_with_the_session() {
    if !has_bwrap() {
        return;
    }
    let profile = "id = \"boxed\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
         [sandbox]\nfilesystem = \"workspace\"\nnetwork = \"none\"\n";
    let daemon = Daemon::start_with_profiles(&[], &[("boxed.toml", profile)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("boxed", &daemon.workspace("boxed")).await;
    // A marker only this grandchild's command line holds.
    let marker = format!("{}", 100_000 + std::process::id());
    let said =
        sh(&api, &session, &format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 &")).await;
    assert_eq!(said, "exit 0: ");
    let grandchild = find_process(&format!("sleep\0{marker}")).expect("the grandchild runs");
    let ns = |pid: &str, kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap();
    for kind in ["net", "mnt", "pid"] {
        assert_ne!(ns(&grandchild.to_string(), kind), ns("self", kind), "its {kind} namespace");
    }
    let pidfd = agentctl::process::PidFd::open(grandchild).expect("a pidfd of the grandchild");
    ok("stop", api.typed().session_stop(session.clone())).await;
    tether_tests::within("the grandchild to die with the session", pidfd.exited())
        .await
        .expect("pidfd");
}

/// A daemon with one Docker profile of mock-agent's test image, `id`, made from the
/// `mock-docker` one by `edit`; with the cleanup of its containers and image.
async fn docker_daemon(
    engine: &bollard::Docker,
    id: &str,
    edit: impl FnOnce(String) -> String,
) -> (Daemon, tether_tests::docker::Cleanup) {
    use tether_tests::docker;
    let tag = format!("tether-test-mock:{}", uuid::Uuid::new_v4().simple());
    docker::build_mock_image(engine, &tag).await;
    let profile =
        edit(docker::mock_docker_profile(&tag).replace("\"mock-docker\"", &format!("{id:?}")));
    let agentctl = docker::static_binary("TETHER_STATIC_AGENTCTL", "agentctl");
    let daemon = Daemon::start_with_env(
        &["--static-agentctl", agentctl.to_str().unwrap()],
        &[(&format!("{id}.toml"), &profile)],
        &[],
    )
    .await;
    let label = format!("tether.install_id={}", daemon.install_id);
    (daemon, docker::Cleanup { label, image: Some(tag) })
}

/// The pid of the process whose command line (NUL-separated) contains `needle`.
fn find_process(needle: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline).contains(needle).then_some(pid)
    })
}

/// The egress proxy lives with the agent's sidecar, not with the daemon: a connection the
/// agent opened through it goes on while the daemon is killed and restarted, and the turn
/// that waited on it ends with the answer.
#[tokio::test]
async fn a_sandboxed_agents_connection_outlives_a_restart_of_the_daemon() {
    if !has_bwrap() {
        return;
    }
    // An "outside" server that answers its one request when the test lets it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (arrived_tx, arrived) = tokio::sync::oneshot::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut head = [0u8; 4096];
        let _ = stream.read(&mut head);
        let _ = arrived_tx.send(());
        let _ = released.recv();
        let body = "answered across the restart";
        let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        stream.write_all(answer.as_bytes()).unwrap();
    });
    let profile = format!(
        "id = \"boxed\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
         [sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\nallow = [\"127.0.0.1:{port}\"]\n"
    );
    let mut daemon = Daemon::start_with_profiles(&[], &[("boxed.toml", &profile)]).await;
    let api = daemon.api().await;
    let session = api.ready_session("boxed", &daemon.workspace("boxed")).await;
    let after = api.status(&session).await.last_event_seq;
    api.prompt(&session, &format!("/sh curl -sS -m 120 http://127.0.0.1:{port}/\nwait"))
        .await
        .unwrap();
    tether_tests::within("the agent's request to arrive", arrived).await.unwrap();
    daemon.kill().await;
    release.send(()).unwrap();
    daemon.restart().await;
    let api = daemon.api().await;
    let mut events = api.subscribe(&session, after).await;
    let seen = until(&mut events, tether_tests::daemon::turn_ended).await;
    let reply = tether_tests::daemon::chunks(&seen).concat();
    assert!(reply.contains("sh exit 0: answered across the restart"), "{reply}");
}

/// `config.toml`'s `[sandbox]` confines the agents of every profile without one (here the
/// built-in mock: no network); a profile saying `host` and `host` opts out.
#[tokio::test]
async fn the_daemons_default_sandbox_confines_profiles_without_their_own() {
    if !has_bwrap() {
        return;
    }
    let open = "id = \"open\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
        [sandbox]\nfilesystem = \"host\"\nnetwork = \"host\"\n";
    let (daemon, ()) = Daemon::start_prepared(&[], &[("open.toml", open)], &[], |root| {
        std::fs::create_dir_all(root.join("tether")).unwrap();
        std::fs::write(root.join("tether/config.toml"), "[sandbox]\nnetwork = \"none\"\n").unwrap();
    })
    .await;
    let api = daemon.api().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let agents = ok("agents.list", api.typed().agents_list()).await;
    let mock = agents.iter().find(|a| a.id == "mock").expect("mock");
    assert_eq!(mock.sandbox.as_ref().map(|s| s.network.as_str()), Some("none"), "{mock:?}");
    let confined = api.ready_session("mock", &daemon.workspace("confined")).await;
    let reply = api.ask(&confined, &format!("/connect 127.0.0.1:{port}\nreach out")).await;
    assert!(reply.contains(&format!("connect 127.0.0.1:{port} failed")), "{reply}");
    assert_eq!(api.status(&confined).await.sandbox.map(|s| s.network), Some("none".into()));
    let session = api.ready_session("open", &daemon.workspace("open")).await;
    let reply = api.ask(&session, &format!("/connect 127.0.0.1:{port}\nreach out")).await;
    assert!(reply.contains(&format!("connect 127.0.0.1:{port}: connected")), "{reply}");
    assert_eq!(api.status(&session).await.sandbox, None);
}

/// bubblewrap as a normal user (here `[process] user = "nobody"` under a root daemon: it
/// makes a user namespace of its own): the agent runs as nobody in the workspace sandbox,
/// reaches its allowlisted server through the proxy — whose socket is in a directory only
/// the daemon's user may enter — and writes in the workspace shared with it.
#[tokio::test]
async fn a_sandbox_works_for_an_agent_run_as_a_normal_user() {
    const NOBODY: u32 = 65534;
    if !has_bwrap() {
        return;
    }
    let allowed = outside("to nobody, through the proxy");
    let profile = format!(
        "id = \"isolated\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
         [process]\nuser = \"nobody\"\n\
         [sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\nallow = [\"127.0.0.1:{allowed}\"]\n"
    );
    // Another user is a boundary only when the API asks for a token.
    let token = [("TETHER_AUTH_TOKEN", "sandboxed-4c1f9e0a7b2d3658")];
    let (daemon, ()) =
        Daemon::start_prepared(&[], &[("isolated.toml", &profile)], &token, |root| {
            tether_tests::daemon::share_workspace_with(root, "iso", NOBODY)
        })
        .await;
    let bearer = "Bearer sandboxed-4c1f9e0a7b2d3658";
    let api = tether_tests::daemon::Api::connect(&daemon.url, &[("Authorization", bearer)])
        .await
        .unwrap();
    let work = daemon.workspace("iso");
    let session = api.ready_session("isolated", &work).await;
    assert_eq!(sh(&api, &session, "id -u").await, format!("exit 0: {NOBODY}"));
    let through = sh(&api, &session, &format!("curl -sS -m 5 http://127.0.0.1:{allowed}/")).await;
    assert_eq!(through, "exit 0: to nobody, through the proxy");
    let wrote = sh(&api, &session, "echo mine > nobodys.txt && echo ok").await;
    assert_eq!(wrote, "exit 0: ok");
    let owner =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(work.join("nobodys.txt")).unwrap());
    assert_eq!(owner, NOBODY);
    let db = daemon.data_dir().join("state.db");
    let reply = api.ask(&session, &format!("/peek {}\nlook", db.display())).await;
    assert!(reply.contains("No such file or directory"), "{reply}");
}

/// A machine where bubblewrap cannot make a sandbox (here a `bwrap` first on the daemon's
/// `PATH` that fails as a kernel without user namespaces makes it fail): the session fails
/// to start, saying bubblewrap's own words and the fix; nothing runs unconfined.
#[tokio::test]
async fn a_machine_that_cannot_sandbox_fails_the_start_with_the_cause() {
    use std::os::unix::fs::PermissionsExt;
    let bin = tempfile::tempdir().unwrap();
    let fake = bin.path().join("bwrap");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely because the kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
    let profile = "id = \"boxed\"\ncommand = [\"mock-agent\"]\nprotocol = \"acp\"\n\
        [sandbox]\nnetwork = \"none\"\n";
    let daemon =
        Daemon::start_with_env(&[], &[("boxed.toml", profile)], &[("PATH", path.as_str())]).await;
    let api = daemon.api().await;
    let workspace = daemon.workspace("boxed");
    let session = api.create_session("boxed", &workspace).await.unwrap();
    let mut events = api.subscribe(&session, 0).await;
    let (state, error) = tether_tests::daemon::settled(&mut events).await;
    assert_eq!(state, protocol::api::SessionState::Failed, "{error}");
    assert!(error.contains("non-privileged user namespaces"), "bubblewrap's words: {error}");
    assert!(error.contains("kernel.unprivileged_userns_clone=1"), "the fix: {error}");
    assert!(error.contains("never run unconfined"), "{error}");
    assert!(Daemon::processes_mentioning(&workspace).is_empty(), "no agent started");
}

/// The Docker runtime with the same profile gives the same results: the container's agent
/// reaches its allowlisted server (on this host, at the bridge's gateway) only through the
/// proxy, one not on the list is refused and the refusal is an event, a direct connection
/// has no route, and the daemon's data is not there; its root is read-only.
#[tokio::test]
async fn the_docker_runtime_confines_a_sandboxed_agent_alike() {
    use tether_tests::docker;
    let Some(engine) = docker::engine().await else { return };
    let bridge = engine.inspect_network("bridge", None).await.expect("the default bridge");
    let gateway = bridge
        .ipam
        .and_then(|ipam| ipam.config)
        .and_then(|configs| configs.into_iter().find_map(|config| config.gateway))
        .expect("the bridge's gateway");
    let serve = |body| outside_on(&gateway, body);
    let (allowed, other) = (serve("from the allowed server"), serve("from another"));
    let sandbox = format!(
        "[sandbox]\nfilesystem = \"workspace\"\nnetwork = \"allowlist\"\nallow = [\"{gateway}:{allowed}\"]\n"
    );
    let (daemon, _cleanup) =
        docker_daemon(&engine, "boxed-docker", |profile| profile + &sandbox).await;
    let api = daemon.api().await;
    let session = api.ready_session("boxed-docker", &daemon.workspace("boxed")).await;
    let sandbox = api.status(&session).await.sandbox.expect("confined");
    assert_eq!(sandbox.by.as_deref(), Some("docker"));
    let mut events = api.subscribe_at_end(&session).await;
    let url = format!("http://{gateway}:{allowed}/");
    let reply = api.ask(&session, &format!("/fetch {url}\nthrough")).await;
    assert!(
        reply.contains(&format!("fetch {url}: HTTP/1.1 200 OK from the allowed server")),
        "{reply}"
    );
    let url = format!("http://{gateway}:{other}/");
    let reply = api.ask(&session, &format!("/fetch {url}\nrefused")).await;
    assert!(
        reply.contains("403") && reply.contains("not on this session's egress allowlist"),
        "{reply}"
    );
    let seen =
        until(&mut events, |event| matches!(&event.kind, EventKind::EgressRefused { .. })).await;
    let EventKind::EgressRefused { target, .. } = &seen.last().unwrap().kind else {
        unreachable!()
    };
    assert_eq!(target, &format!("{gateway}:{other}"));
    let reply = api.ask(&session, &format!("/connect {gateway}:{allowed}\ndirect")).await;
    assert!(reply.contains(&format!("connect {gateway}:{allowed} failed")), "no route: {reply}");
    let db = daemon.data_dir().join("state.db");
    let reply =
        api.ask(&session, &format!("/peek {}\n/peek /etc/hostname\nlook", db.display())).await;
    assert!(reply.contains(&format!("peek {} failed", db.display())), "{reply}");
    let container = engine
        .inspect_container(&format!("tether-{session}"), None)
        .await
        .expect("the session's container");
    let host = container.host_config.expect("its host config");
    assert_eq!(host.readonly_rootfs, Some(true), "a read-only root");
}

/// `[docker] runtime = "runsc"` (gVisor) is said in `agents`, and on an engine without it
/// the session fails to start naming the runtime and the fix; nothing runs without it.
#[tokio::test]
async fn a_container_runtime_the_engine_lacks_fails_the_start_saying_so() {
    use tether_tests::docker;
    let Some(engine) = docker::engine().await else { return };
    let info = engine.info().await.expect("the engine's info");
    if info.runtimes.is_some_and(|runtimes| runtimes.contains_key("runsc")) {
        return println!("SKIPPED: this engine has runsc (the test needs one without it)");
    }
    let (daemon, _cleanup) = docker_daemon(&engine, "gvisor", |profile| {
        profile.replace("[docker]\n", "[docker]\nruntime = \"runsc\"\n")
            + "[sandbox]\nnetwork = \"none\"\n"
    })
    .await;
    let api = daemon.api().await;
    let agents = ok("agents.list", api.typed().agents_list()).await;
    let gvisor = agents.iter().find(|agent| agent.id == "gvisor").expect("listed");
    let by = gvisor.sandbox.as_ref().and_then(|sandbox| sandbox.by.clone());
    assert_eq!(by.as_deref(), Some("docker, runtime runsc"), "{gvisor:?}");
    let session = api.create_session("gvisor", &daemon.workspace("g")).await.unwrap();
    let mut events = api.subscribe(&session, 0).await;
    let (state, error) = tether_tests::daemon::settled(&mut events).await;
    assert_eq!(state, protocol::api::SessionState::Failed, "{error}");
    assert!(
        error.contains("[docker] runtime = \"runsc\"") && error.contains("no such runtime"),
        "{error}"
    );
    assert!(error.contains("install it"), "the fix: {error}");
}
