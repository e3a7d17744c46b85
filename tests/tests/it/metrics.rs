//! Metrics: `GET /metrics` on the API's address, in OpenMetrics text, under the
//! API's access rules; a scripted workload moves each counter by what it did.

use std::collections::HashMap;

use protocol::api::ApiClient;
use protocol::errors::ErrorKind;
use tether_tests::browser::http;
use tether_tests::daemon::{Api, Daemon, kill_sidecar, refused};

/// The samples of a scrape: `name{labels}` → value.
pub(crate) fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

pub(crate) async fn scrape(daemon: &Daemon, headers: &[(&str, &str)]) -> HashMap<String, f64> {
    let addr = daemon.url.trim_start_matches("ws://").to_owned();
    let (status, head, body) = http(&addr, "GET", "/metrics", headers, None).await;
    assert_eq!(status, 200, "{body}");
    let content_type =
        head.iter().find(|(name, _)| name == "content-type").map(|(_, v)| v.as_str());
    assert_eq!(content_type, Some("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    assert!(body.ends_with("# EOF\n"), "{body}");
    samples(&body)
}

pub(crate) fn value(samples: &HashMap<String, f64>, name: &str) -> f64 {
    samples.get(name).copied().unwrap_or(0.0)
}

fn moved(before: &HashMap<String, f64>, after: &HashMap<String, f64>, name: &str) -> f64 {
    value(after, name) - value(before, name)
}

#[tokio::test]
async fn a_scripted_workload_moves_the_counters_by_what_it_did() {
    let mut daemon = Daemon::start(&[]).await;
    let before = scrape(&daemon, &[]).await;
    let api: Api = daemon.api().await;
    let a = api.ready_session("mock", &daemon.workspace("a")).await;
    let b = api.ready_session("mock", &daemon.workspace("b")).await;
    api.ask(&a, "/stream 5\none").await;
    api.ask(&a, "two").await;
    api.ask(&b, "three").await;
    kill_sidecar(&daemon, &api, &b).await;
    assert_eq!(api.resume(&b).await.unwrap().outcome, protocol::api::ResumeOutcome::NativeLoad);
    let bad =
        refused("a bad prompt", api.typed().session_prompt("not-a-uuid".into(), "x".into())).await;
    assert_eq!(bad.kind, ErrorKind::InvalidParams);
    let after = scrape(&daemon, &[]).await;

    let requests = |method: &str, error: &str| {
        format!("tether_api_requests_total{{method=\"{method}\",error=\"{error}\"}}")
    };
    assert_eq!(moved(&before, &after, &requests("task.session.create", "none")), 2.0);
    assert_eq!(moved(&before, &after, &requests("task.session.prompt", "none")), 3.0);
    assert_eq!(moved(&before, &after, &requests("task.session.prompt", "invalid_params")), 1.0);
    assert_eq!(moved(&before, &after, &requests("task.session.resume", "none")), 1.0);
    assert_eq!(moved(&before, &after, "tether_resumes_total{outcome=\"native_load\"}"), 1.0);
    assert_eq!(moved(&before, &after, "tether_launch_seconds_count"), 2.0);
    assert_eq!(moved(&before, &after, "tether_resume_seconds_count"), 1.0);
    // What exists now.
    let waiting = "tether_sessions{state=\"WAITING_FOR_INPUT\",runtime=\"standalone\"}";
    assert_eq!(value(&after, waiting), 2.0, "{after:?}");
    assert_eq!(value(&after, "tether_live_executions"), 2.0);
    // The relay: every event handled, acknowledged, published; the store was used.
    assert!(moved(&before, &after, "tether_relayed_events_total") >= 10.0, "{after:?}");
    assert!(moved(&before, &after, "tether_published_events_total") >= 10.0);
    assert!(moved(&before, &after, "tether_published_bytes_total") > 1000.0);
    assert!(moved(&before, &after, "tether_acks_total") >= 3.0);
    assert!(moved(&before, &after, "tether_ack_lag_events_count") >= 3.0);
    assert!(moved(&before, &after, "tether_store_call_seconds_count") >= 20.0);

    // A restart: what recovery found (two live sidecars re-attached).
    drop(api);
    daemon.kill().await;
    daemon.restart().await;
    let restarted = scrape(&daemon, &[]).await;
    assert_eq!(value(&restarted, "tether_recovery_sessions_total{outcome=\"reattaching\"}"), 2.0);
    assert_eq!(value(&restarted, "tether_recovery_sessions_total{outcome=\"dead\"}"), 0.0);
}

#[tokio::test]
async fn metrics_ask_for_the_token_like_the_api() {
    let token = "metrics-s3cret-0123456789";
    let daemon = Daemon::start_with_env(&[], &[], &[("TETHER_AUTH_TOKEN", token)]).await;
    let addr = daemon.url.trim_start_matches("ws://").to_owned();
    let (status, _, _) = http(&addr, "GET", "/metrics", &[], None).await;
    assert_eq!(status, 401);
    let (status, _, _) =
        http(&addr, "GET", "/metrics", &[("Authorization", "Bearer wrong")], None).await;
    assert_eq!(status, 401);
    let bearer = format!("Bearer {token}");
    let scraped = scrape(&daemon, &[("Authorization", &bearer)]).await;
    assert!(scraped.contains_key("tether_live_executions"), "{scraped:?}");
    // Another site's page may not read it either.
    let (status, _, _) = http(
        &addr,
        "GET",
        "/metrics",
        &[("Authorization", &bearer), ("Origin", "http://evil.example")],
        None,
    )
    .await;
    assert_eq!(status, 403);
}
