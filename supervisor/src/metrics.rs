//! Prometheus metrics, served as OpenMetrics text at `GET /metrics` on the API's
//! address, under the same access rules as the API.
//!
//! One registry per process ([`get`]): the counters and histograms are atomics that the
//! parts of the daemon bump where things happen (the session actor, the store thread, the
//! RPC middleware, recovery); the gauges of what exists now — sessions by state and
//! runtime, live executions — are read from the store and the session table when scraped,
//! so they can never drift from the truth.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A metric's labels: `(name, value)` pairs.
pub type Labels = Vec<(&'static str, String)>;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric of the daemon.
pub struct Metrics {
    registry: Registry,
    /// Sessions now, by `state` and `runtime` (set at scrape time).
    pub sessions: Family<Labels, Gauge>,
    /// Executions whose agent runs now (set at scrape time).
    pub live_executions: Gauge,
    /// Resumes, by `outcome`.
    pub resumes: Family<Labels, Counter>,
    /// From the start of a resume's launch to its ACP session open, seconds.
    pub resume_seconds: Histogram,
    /// From the start of a first launch to its ACP session open, seconds.
    pub launch_seconds: Histogram,
    /// Agent events handled (each one relayed by agentctl and handled by an actor).
    pub relayed_events: Counter,
    /// Session events published to subscribers (written to the session event logs).
    pub published_events: Counter,
    /// Bytes of session events written to the event logs.
    pub published_bytes: Counter,
    /// Acknowledgements sent to agentctl.
    pub acks: Counter,
    /// Connections a confined agent's egress proxy refused (a target not on its allowlist).
    pub egress_refused: Counter,
    /// Events handled but not yet acknowledged when an acknowledgement went out.
    pub ack_lag: Histogram,
    /// What restart recovery found, by `outcome` (`at_rest`, `dead`, `interrupted`,
    /// `reattaching`, `approvals_restored`, `approvals_cancelled`, `orphans_removed`,
    /// `skipped`).
    pub recovery: Family<Labels, Counter>,
    /// Time of one store call (queueing included), seconds.
    pub store_seconds: Histogram,
    /// API requests, by `method` and `error` kind (`none` when it succeeded).
    pub api_requests: Family<Labels, Counter>,
    /// Workflow steps now, by `state` (set at scrape time).
    pub workflow_steps: Family<Labels, Gauge>,
    /// From a step's start to its completion, seconds.
    pub step_seconds: Histogram,
    /// Workflows resumed (`workflow.resume`).
    pub workflow_resumes: Counter,
    /// Sessions parked now: `PAUSED` because their agent was idle (set at scrape time).
    pub parked: Gauge,
    /// Idle sessions parked.
    pub evictions: Counter,
    /// Parked sessions brought back (a prompt or resume).
    pub wakeups: Counter,
    /// From a parked session's resume to its open agent session, seconds.
    pub wake_seconds: Histogram,
    /// Warm agents ready now, by `profile` (set at scrape time).
    pub pool_ready: Family<Labels, Gauge>,
    /// Launches that asked the pool, by `outcome` (`claimed`, `empty`).
    pub pool_takes: Family<Labels, Counter>,
    /// Tokens the agents reported, by `direction` (`input`, `output`, `cached_read`,
    /// `cached_write`, `thought`) and `profile`.
    pub tokens: Family<Labels, Counter>,
    /// Each Docker engine's state, by `engine` and `state` (`serving`, `draining`,
    /// `drained`, `unreachable`): 1 for its state now (set when engines are listed and at
    /// scrape time).
    pub engine_state: Family<Labels, Gauge>,
    /// Sessions moved off an engine, by `reason` (`drain`, `failover`).
    pub moves: Family<Labels, Counter>,
    /// Cost the agents reported, by `currency` and `profile`.
    pub cost: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>,
}

fn seconds() -> Histogram {
    // 100 µs … ~26 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Metrics {
    #[expect(clippy::too_many_lines, reason = "a catalogue: one entry per metric family")]
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tether");
        let metrics = Metrics {
            sessions: Family::default(),
            live_executions: Gauge::default(),
            resumes: Family::default(),
            resume_seconds: seconds(),
            launch_seconds: seconds(),
            relayed_events: Counter::default(),
            published_events: Counter::default(),
            published_bytes: Counter::default(),
            acks: Counter::default(),
            egress_refused: Counter::default(),
            ack_lag: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            recovery: Family::default(),
            store_seconds: seconds(),
            api_requests: Family::default(),
            workflow_steps: Family::default(),
            step_seconds: seconds(),
            workflow_resumes: Counter::default(),
            parked: Gauge::default(),
            evictions: Counter::default(),
            wakeups: Counter::default(),
            wake_seconds: seconds(),
            tokens: Family::default(),
            cost: Family::default(),
            pool_ready: Family::default(),
            pool_takes: Family::default(),
            engine_state: Family::default(),
            moves: Family::default(),
            registry: Registry::default(),
        };
        registry.register("sessions", "Sessions by state and runtime", metrics.sessions.clone());
        registry.register(
            "live_executions",
            "Executions whose agent is running",
            metrics.live_executions.clone(),
        );
        registry.register("resumes", "Resumes by outcome", metrics.resumes.clone());
        registry.register(
            "resume_seconds",
            "Time from a resume's launch to its open agent session",
            metrics.resume_seconds.clone(),
        );
        registry.register(
            "launch_seconds",
            "Time from a first launch to its open agent session",
            metrics.launch_seconds.clone(),
        );
        registry.register(
            "relayed_events",
            "Agent events relayed by agentctl and handled",
            metrics.relayed_events.clone(),
        );
        registry.register(
            "published_events",
            "Session events published to subscribers",
            metrics.published_events.clone(),
        );
        registry.register(
            "published_bytes",
            "Bytes of session events written to the event logs",
            metrics.published_bytes.clone(),
        );
        registry.register("acks", "Acknowledgements sent to agentctl", metrics.acks.clone());
        registry.register(
            "egress_refused",
            "Connections a confined agent's egress proxy refused",
            metrics.egress_refused.clone(),
        );
        registry.register(
            "ack_lag_events",
            "Events handled but not yet acknowledged when an acknowledgement went out",
            metrics.ack_lag.clone(),
        );
        registry.register(
            "recovery_sessions",
            "What restart recovery found, by outcome",
            metrics.recovery.clone(),
        );
        registry.register(
            "store_call_seconds",
            "Time of one store call, queueing included",
            metrics.store_seconds.clone(),
        );
        registry.register(
            "api_requests",
            "API requests by method and error kind",
            metrics.api_requests.clone(),
        );
        registry.register(
            "workflow_steps",
            "Workflow steps by state",
            metrics.workflow_steps.clone(),
        );
        registry.register(
            "workflow_step_seconds",
            "Time from a workflow step's start to its completion",
            metrics.step_seconds.clone(),
        );
        registry.register(
            "workflow_resumes",
            "Workflows resumed",
            metrics.workflow_resumes.clone(),
        );
        registry.register(
            "sessions_parked",
            "Sessions parked because their agent was idle",
            metrics.parked.clone(),
        );
        registry.register("evictions", "Idle sessions parked", metrics.evictions.clone());
        registry.register("wakeups", "Parked sessions brought back", metrics.wakeups.clone());
        registry.register(
            "wake_seconds",
            "Time from a parked session's resume to its open agent session",
            metrics.wake_seconds.clone(),
        );
        registry.register(
            "pool_ready",
            "Warm agents ready, by profile",
            metrics.pool_ready.clone(),
        );
        registry.register(
            "pool_takes",
            "Launches that asked the pool for a warm agent, by outcome",
            metrics.pool_takes.clone(),
        );
        registry.register(
            "tokens",
            "Tokens the agents reported, by direction and profile",
            metrics.tokens.clone(),
        );
        registry.register(
            "cost",
            "Cost the agents reported, by currency and profile",
            metrics.cost.clone(),
        );
        registry.register(
            "engine_state",
            "Each Docker engine's state: 1 for the state it is in",
            metrics.engine_state.clone(),
        );
        registry.register(
            "session_moves",
            "Sessions moved off an engine, by reason",
            metrics.moves.clone(),
        );
        Metrics { registry, ..metrics }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

/// One label.
pub fn label(name: &'static str, value: impl Into<String>) -> Labels {
    vec![(name, value.into())]
}

/// Observes a duration in seconds.
pub fn observe(histogram: &Histogram, elapsed: Duration) {
    histogram.observe(elapsed.as_secs_f64());
}

/// The registry as OpenMetrics text.
pub fn render() -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &get().registry);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_every_family_with_its_labels() {
        let metrics = get();
        metrics.resumes.get_or_create(&label("outcome", "native_load")).inc();
        metrics
            .api_requests
            .get_or_create(&vec![("method", "x".into()), ("error", "none".into())])
            .inc();
        observe(&metrics.store_seconds, Duration::from_millis(2));
        let text = render();
        assert!(text.contains("# TYPE tether_resumes counter"), "{text}");
        assert!(text.contains("tether_resumes_total{outcome=\"native_load\"} 1"), "{text}");
        assert!(
            text.contains("tether_api_requests_total{method=\"x\",error=\"none\"} 1"),
            "{text}"
        );
        assert!(text.contains("tether_store_call_seconds_count 1"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
