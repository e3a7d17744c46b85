// @ts-check
// The session's other views: its whole history (task.session.history), a graphical
// timeline of its executions and turns with what happened to it (task.session.timeline),
// its snapshots (task.session.snapshot.list/get) and workspace checkpoints
// (task.session.checkpoint.list/restore), its Changes (changes.js), and the dialog that pauses it with a
// reason.
import * as Changes from "./changes.js";
import * as Turns from "./turns.js";
import { messageStart, startsInsideMessage } from "./windows.js";
import { actOnSession, activity, rpc, sessionError } from "./app.js";
import { $, SUMMARY_ASKED, el, formatTokens, joinNotices, markCurrent, markdown, render, renderElicitation, renderPermission, renderUsage } from "./render.js";
import { state } from "./state.js";

export const TABS = ["transcript", "history", "timeline", "snapshots", "changes"];

export function showTab(name) {
  for (const tab of TABS) {
    $("#" + tab).hidden = tab !== name;
    const button = $(`[data-tab="${tab}"]`);
    button.classList.toggle("active", tab === name);
    button.setAttribute("aria-selected", String(tab === name));
    // One tab in the Tab order; the arrows move between them.
    button.tabIndex = tab === name ? 0 : -1;
  }
  $("#jump").hidden = true;
  $("#transcript-tools").classList.toggle("away", name !== "transcript");
  // A fork's given conversation goes with its transcript.
  $("#forked-conversation").classList.toggle("away", name !== "transcript");
  if (name === "history") loadHistory();
  if (name === "timeline") loadTimeline();
  if (name === "snapshots") loadSnapshots();
  if (name === "changes") Changes.show();
}

export async function loadHistory() {
  try {
    const entries = await rpc.call("task.session.history", { session_id: state.open });
    $("#history").replaceChildren(
      // A rewound turn's entries stay, dimmed and labelled (rewind.js).
      ...entries.map((e) => el("li", { class: `entry ${e.type}${e.rewound ? " rewound" : ""}` },
        `${e.rewound ? "(rewound) " : ""}[${e.type}] ${e.tool_name ? e.tool_name + ": " : ""}${e.content}`)),
    );
  } catch (error) {
    sessionError(error);
  }
}

// ---- the timeline ----------------------------------------------------------------------

export const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  node.append(...children);
  return node;
}

export function duration(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

export async function loadTimeline() {
  try {
    const timeline = await rpc.call("task.session.timeline", { session_id: state.open });
    $("#timeline-chart").replaceChildren(timelineChart(timeline));
    $("#timeline-entries").replaceChildren(...executionCards(timeline).reverse().map(executionCard));
  } catch (error) {
    sessionError(error);
  }
}

// ---- the executions as cards -----------------------------------------------------------

// How a run of the agent began, and how a pause's trigger reads on its badge.
export const STARTS = { fresh: "fresh start", native_load: "restored (load)", native_resume: "restored (resume)", history_injection: "history injected", handoff: "handed over", already_running: "re-attached" };
export const TRIGGERS = { pause: "paused", exhaustion: "context full", timeout: "paused (forced)", idle: "parked (idle)", budget: "budget reached", max_turns: "max turns", max_duration: "max duration", crash: "crashed" };

// Groups the timeline by execution (one run of the agent): how each began, its turns, how
// it ended (a pause and its trigger, an error, the session's end) and its events.
export function executionCards(timeline) {
  const cards = [];
  const card = (id) => {
    let found = cards.find((c) => c.id === id);
    if (!found) {
      const info = timeline.executions.find((e) => e.execution_id === id) || {};
      found = { id, generation: info.generation, current: info.current, status: info.status, how: info.resume_outcome || null, started: null, end: null, events: [] };
      cards.push(found);
    }
    return found;
  };
  let current = null;
  const before = [];
  for (const entry of timeline.entries) {
    if (entry.kind === "execution_started") {
      current = card(entry.execution_id);
      current.generation = entry.generation;
      current.started = entry.at;
      current.events.unshift(...before.splice(0));
    } else if (entry.kind === "resumed") {
      current = card(entry.execution_id);
      current.how = entry.outcome;
    }
    if (!current) { before.push(entry); continue; }
    current.events.push(entry);
    if (entry.kind === "plan") current.plan = entry;
    if (entry.kind === "paused") current.end = { badge: TRIGGERS[entry.trigger] || entry.trigger, trigger: entry.trigger, detail: entry.reason };
    else if (entry.kind === "error" && !current.end) current.end = { badge: "error", trigger: "error", detail: entry.message };
    else if (entry.kind === "state" && ["COMPLETED", "CANCELLED", "FAILED"].includes(entry.state)) current.end = { badge: entry.state.toLowerCase(), trigger: "ended", detail: entry.error };
  }
  for (const exec of timeline.executions) card(exec.execution_id);
  cards.forEach((c, index) => {
    c.number = c.generation || index + 1;
    if (!c.how && c.number === 1) c.how = "fresh";
    c.turns = timeline.turns.filter((t) => t.execution_id === c.id);
    c.started = c.started || (c.turns[0] && c.turns[0].started_at) || (c.events[0] && c.events[0].at);
  });
  return cards.sort((a, b) => a.number - b.number);
}

export function executionCard(c) {
  const ended = c.turns.filter((t) => t.ended_at);
  const last = c.events.length ? c.events[c.events.length - 1].at : c.started;
  const counts = ["completed", "failed", "cancelled", "interrupted"].map((s) => [s, c.turns.filter((t) => t.ended_at && t.state === s).length]).filter(([, n]) => n);
  const end = c.end
    ? el("span", { class: `badge trigger trigger-${c.end.trigger}`, title: c.end.detail || "" }, c.end.badge)
    : el("span", { class: "badge trigger trigger-live" }, c.current ? (c.status || "running") : "ended");
  const progress = el("div", { class: "progress", role: "img", "aria-label": `${ended.length} of ${c.turns.length} turns ended` },
    ...c.turns.map((t) => el("span", { class: `seg ${t.ended_at ? t.state : "running"}`, title: `${t.ended_at ? t.state : "running"}${t.stop_reason ? " (" + t.stop_reason + ")" : ""}` })));
  const events = el("details", {}, el("summary", {}, `${c.events.length} events`),
    el("ol", { class: "card-events" }, ...c.events.map((entry) => {
      const { at, kind, ...rest } = entry;
      delete rest.seq;
      const detail = Object.entries(rest).map(([k, v]) => `${k}=${v}`).join(" ");
      return el("li", { class: `entry ${kind}` }, `${new Date(at).toLocaleTimeString()} ${kind} ${detail}`);
    })));
  return el("section", { class: `exec-card${c.current ? " current" : ""}`, "data-execution": c.id },
    el("header", {},
      el("strong", {}, `Run ${c.number}`),
      c.how ? el("span", { class: `badge start start-${c.how}` }, STARTS[c.how] || c.how.replace("_", " ")) : "",
      end),
    el("p", { class: "muted card-meta" },
      `${c.started ? new Date(c.started).toLocaleTimeString() : "not started"} · ${c.turns.length} turn${c.turns.length === 1 ? "" : "s"}` +
        (counts.length ? ` (${counts.map(([s, n]) => `${n} ${s}`).join(", ")})` : "") +
        (c.started && last ? ` · ${duration(Math.max(0, last - c.started))}` : "") +
        (c.end && c.end.detail ? ` · ${c.end.detail}` : "")),
    c.plan ? el("p", { class: "card-plan" }, `Plan: ${c.plan.done} of ${c.plan.total} done` +
      (c.plan.in_progress ? `, ${c.plan.in_progress} in progress` : "") + (c.plan.current ? ` — now: ${c.plan.current}` : "")) : "",
    progress, events);
}

// One lane per execution (a run of the agent), each turn a bar coloured by how it ended;
// pauses, resumes, snapshots, moves between engines and errors are marks on the time axis.
export function timelineChart(timeline) {
  const turns = timeline.turns;
  const marks = timeline.entries.filter((e) => ["paused", "resumed", "snapshot_taken", "moved", "error", "execution_started"].includes(e.kind));
  const times = [...turns.flatMap((t) => [t.started_at, t.ended_at || Date.now()]), ...marks.map((m) => m.at)];
  if (!times.length) return el("p", { class: "muted" }, "No turns yet.");
  const start = Math.min(...times);
  const end = Math.max(...times, start + 1000);
  const lanes = [...new Set([...timeline.executions.map((e) => e.execution_id), ...turns.map((t) => t.execution_id)])];
  const width = 800;
  const laneHeight = 22;
  const top = 18;
  const height = top + lanes.length * laneHeight + 26;
  const x = (t) => 70 + ((t - start) / (end - start)) * (width - 80);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `timeline: ${turns.length} turns in ${lanes.length} executions over ${duration(end - start)}` });
  lanes.forEach((lane, index) => {
    const y = top + index * laneHeight;
    chart.append(svg("text", { x: 0, y: y + 14, class: "lane" }, `run ${index + 1}`));
    chart.append(svg("line", { x1: 70, x2: width - 10, y1: y + 10, y2: y + 10, class: "lane-line" }));
  });
  for (const turn of turns) {
    const y = top + lanes.indexOf(turn.execution_id) * laneHeight;
    const x1 = x(turn.started_at);
    const x2 = Math.max(x(turn.ended_at || Date.now()), x1 + 3);
    const state = turn.ended_at ? turn.state : "running";
    const bar = svg("rect", { x: x1, y: y + 3, width: x2 - x1, height: 14, rx: 3, class: `turn ${state}`, "data-turn": turn.turn_id });
    bar.append(svg("title", {}, `turn ${state}${turn.stop_reason ? " (" + turn.stop_reason + ")" : ""}, ${duration((turn.ended_at || Date.now()) - turn.started_at)}${turn.error ? ": " + turn.error : ""}`));
    chart.append(bar);
  }
  const axisY = top + lanes.length * laneHeight + 4;
  for (const mark of marks) {
    const mx = x(mark.at);
    const line = svg("line", { x1: mx, x2: mx, y1: top, y2: axisY, class: `mark ${mark.kind}` });
    const moved = mark.kind === "moved" ? ` from ${mark.from} to ${mark.to || "where its next resume places it"}` : "";
    line.append(svg("title", {}, `${new Date(mark.at).toLocaleTimeString()} ${mark.kind.replace("_", " ")}${moved}${mark.message ? ": " + mark.message : ""}${mark.reason ? ` (${mark.reason})` : ""}`));
    chart.append(line);
  }
  chart.append(svg("text", { x: 70, y: axisY + 16, class: "axis" }, new Date(start).toLocaleTimeString()));
  chart.append(svg("text", { x: width - 10, y: axisY + 16, class: "axis end" }, `${new Date(end).toLocaleTimeString()} (${duration(end - start)})`));
  const legend = el("div", { class: "legend muted" },
    ...["completed", "failed", "cancelled", "interrupted", "running"].map((s) => el("span", { class: `key ${s}` }, s)),
    ...["paused", "resumed", "snapshot_taken", "moved", "error"].map((k) => el("span", { class: `key mark-${k}` }, k.replace("_", " "))));
  return el("div", {}, chart, legend);
}

// ---- snapshots -------------------------------------------------------------------------

// ---- workspace checkpoints --------------------------------------------------------------

/** @param {number} n */
export function byteSize(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  if (n < 1024 * 1024 * 1024) return `${(n / 1024 / 1024).toFixed(1)} MiB`;
  return `${(n / 1024 / 1024 / 1024).toFixed(1)} GiB`;
}

/** One checkpoint, in words: its number, what took it, its files and what it added. */
export function checkpointLabel(c) {
  const what = c.turn ? `turn ${c.turn}` : c.trigger;
  const left = c.left_out && c.left_out.length ? ` · ${c.left_out.length} over the size limit left out` : "";
  return `#${c.seq} · ${what} · ${c.files} files, ${byteSize(c.bytes)} (+${byteSize(c.added_bytes)}) · ${new Date(c.taken_at).toLocaleString()}${left}`;
}

export async function loadCheckpoints() {
  try {
    const listed = await rpc.call("task.session.checkpoint.list", { session_id: state.open });
    const newest = listed.checkpoints.slice().reverse();
    $("#checkpoint-list").replaceChildren(...newest.map((c) => el("li", { "data-checkpoint": c.seq }, checkpointLabel(c))));
    if (!newest.length) $("#checkpoint-list").append(el("li", { class: "muted" }, "No checkpoint yet: one is taken at each turn's end."));
    $("#checkpoint-seq").replaceChildren(...newest.map((c) => el("option", { value: String(c.seq) }, `#${c.seq} (${c.turn ? "turn " + c.turn : c.trigger})`)));
    const form = $("#checkpoint-restore");
    form.hidden = !newest.length;
    form.onsubmit = (event) => {
      event.preventDefault();
      restoreCheckpoint();
    };
  } catch (error) {
    sessionError(error);
  }
}

async function restoreCheckpoint() {
  const seq = Number($("#checkpoint-seq").value);
  const into = $("#checkpoint-into").value.trim();
  try {
    const restored = await rpc.call("task.session.checkpoint.restore", { session_id: state.open, seq, into });
    $("#checkpoint-restored").textContent = `checkpoint #${restored.checkpoint.seq} written into ${restored.into}: ${restored.files} files`;
  } catch (error) {
    $("#checkpoint-restored").textContent = `not written: ${error.message}`;
  }
}

export async function loadSnapshots() {
  loadCheckpoints();
  try {
    const snapshots = await rpc.call("task.session.snapshot.list", { session_id: state.open });
    $("#snapshot-view").replaceChildren();
    $("#snapshot-list").replaceChildren(
      ...snapshots.slice().reverse().map((s) =>
        el("li", {},
          el("button", { class: "link", "data-snapshot": s.snapshot_id, onclick: () => showSnapshot(s.snapshot_id) },
            `${new Date(s.taken_at).toLocaleString()} · ${s.trigger}`),
          s.reason ? el("span", { class: "muted" }, ` ${s.reason}`) : "",
          s.git_branch ? el("span", { class: "muted" }, ` · ${s.git_branch}${s.git_dirty ? " (dirty)" : ""}`) : "")),
    );
    if (!snapshots.length) $("#snapshot-list").append(el("li", { class: "muted" }, "No snapshot yet: one is taken at each pause, crash and finished turn."));
  } catch (error) {
    sessionError(error);
  }
}

export function field(label, ...value) {
  return [el("dt", {}, label), el("dd", {}, ...value)];
}

export async function showSnapshot(snapshotId) {
  try {
    const s = await rpc.call("task.session.snapshot.get", { snapshot_id: snapshotId });
    const git = s.git || {};
    const usage = s.usage || {};
    const facts = el("dl", { class: "facts" },
      ...field("taken", `${new Date(s.taken_at).toLocaleString()} (${s.trigger})${s.reason ? " — " + s.reason : ""}`),
      ...field("task", s.task.title),
      ...(git.repository
        ? field("git", `${git.branch || "detached"} @ ${(git.head_commit || "").slice(0, 8)}${git.dirty ? ", uncommitted changes" : ""}${git.diffstat ? " — " + git.diffstat : ""}`)
        : field("git", "not a repository")),
      ...(git.modified_files && git.modified_files.length ? field("modified", git.modified_files.join(", ")) : []),
      ...field("usage", `${usage.turns || 0} turns, ${usage.tool_calls || 0} tool calls` +
        (usage.context_size ? `, context ${formatTokens(usage.context_used || 0)} / ${formatTokens(usage.context_size)}` : "") +
        (typeof usage.cost === "number" ? `, ${usage.cost.toFixed(2)} ${usage.cost_currency || ""}` : "")));
    const summaryTurn = s.summary && s.summary.turn_id;
    const turns = el("ol", { class: "snapshot-turns" },
      ...s.turns.map((t) => el("li", {},
        t.turn_id === summaryTurn
          ? el("div", { class: "user tether-ask" }, SUMMARY_ASKED)
          : el("div", { class: "user" }, t.prompt),
        t.reply ? el("div", { class: "agent" }, t.reply) : "",
        el("div", { class: "muted" }, `${t.state}${t.stop_reason ? " (" + t.stop_reason + ")" : ""}` +
          (t.tool_calls.length ? ` · tools: ${t.tool_calls.map((c) => `${c.title} (${c.status})`).join(", ")}` : "")))));
    const errors = s.errors.length
      ? el("ul", { class: "snapshot-errors" }, ...s.errors.map((e) =>
        el("li", { class: "error" },
          e.resolution ? el("span", { class: `badge resolution-${e.resolution}` }, e.resolution.replace("_", " ")) : "",
          `${new Date(e.at).toLocaleTimeString()} ${e.source}: ${e.message}${e.followed_by ? " → " + e.followed_by : ""}`)))
      : "";
    const tests = s.tests
      ? el("p", { class: `snapshot-tests ${s.tests.passed ? "passed" : "failed"}` },
        `Last test run: ${s.tests.command} — ${s.tests.passed ? "passed" : "failed"}` +
          (s.tests.failing.length ? `; failing: ${s.tests.failing.join(", ")}` : ""))
      : "";
    const summary = snapshotSummary(s.summary);
    const plan = s.plan && s.plan.length
      ? el("div", { class: "plan snapshot-plan" }, el("div", { class: "plan-head" }, "Plan, as the agent last gave it"),
        el("ol", {}, ...s.plan.map((p) => el("li", { class: `plan-entry ${p.status}` }, p.content))))
      : "";
    $("#snapshot-view").replaceChildren(el("h3", {}, "Snapshot"), facts, summary, plan,
      s.turns_omitted ? el("p", { class: "muted" }, `${s.turns_omitted} older turns not shown`) : "", turns, tests, errors);
  } catch (error) {
    sessionError(error);
  }
}

// What the agent summarised at the pause (decisions with why and what else it considered,
// open problems, next steps), or why there is no summary.
export function snapshotSummary(summary) {
  if (!summary) return "";
  const WHY = { off: "not asked for (the profile's session.summarize_on_pause is off)", skipped: "not asked", invalid: "refused", failed: "not given" };
  if (summary.state !== "stored" || !summary.summary) {
    return el("p", { class: `snapshot-summary muted state-${summary.state}` },
      `Agent's summary: ${WHY[summary.state] || summary.state}${summary.note && summary.state !== "off" ? " — " + summary.note : ""}`);
  }
  const { decisions, open_problems: open, next_steps: next } = summary.summary;
  const list = (title, items, cls) => items.length
    ? [el("div", { class: "plan-head" }, title), el("ul", { class: cls }, ...items.map((i) => el("li", {}, i)))]
    : [];
  return el("div", { class: "snapshot-summary state-stored" },
    ...(decisions.length ? [el("div", { class: "plan-head" }, "Decisions"), el("ul", { class: "decisions" }, ...decisions.map((d) =>
      el("li", {}, el("strong", {}, d.decision),
        d.rationale ? el("span", {}, ` — ${d.rationale}`) : "",
        d.alternatives.length ? el("div", { class: "muted" }, `considered: ${d.alternatives.join("; ")}`) : "")))] : []),
    ...list("Open problems", open, "open-problems"),
    ...list("Next steps", next, "next-steps"));
}

// What changed in the workspace while the session was paused (a resume's `git_drift`):
// someone else's commits and edits, which the agent is told of in its next prompt.
export function showDrift(drift) {
  const box = $("#drift");
  if (!drift) {
    box.hidden = true;
    return;
  }
  const short = (commit) => (commit || "no commit").slice(0, 12);
  const moves = [];
  if (drift.branch_change) moves.push(`branch ${drift.branch_change[0] || "(detached)"} → ${drift.branch_change[1] || "(detached)"}`);
  if (drift.head_rewound) moves.push(`HEAD moved elsewhere: ${short(drift.head_before)} → ${short(drift.head_now)}`);
  else if (drift.commits.length) moves.push(`${drift.commits.length} new commit${drift.commits.length === 1 ? "" : "s"}`);
  box.replaceChildren(
    el("strong", {}, "The workspace changed while the session was paused"),
    el("span", { class: "muted" }, " — the agent is told in its next prompt"),
    moves.length ? el("div", {}, moves.join("; ")) : "",
    drift.commits.length ? el("ul", { class: "drift-commits" }, ...drift.commits.map((c) => el("li", {}, c))) : "",
    drift.changed_files.length ? el("div", { class: "drift-files" }, `Files changed: ${drift.changed_files.join(", ")}`) : "",
    el("button", { class: "quiet", onclick: () => { box.hidden = true; } }, "Dismiss"));
  box.hidden = false;
}

// The tabs as a screen reader's tab list: Left and Right (Home, End) move to a tab and show it.
export function onTabKey(event) {
  const at = TABS.indexOf(event.currentTarget.dataset.tab);
  const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: TABS.length - 1 }[event.key];
  if (to === undefined) return;
  event.preventDefault();
  const name = TABS[(to + TABS.length) % TABS.length];
  showTab(name);
  $(`[data-tab="${name}"]`).focus();
}

// ---- pausing ---------------------------------------------------------------------------

// Pause asks why (the reason is kept with the pause and shown in its events) and how long
// a running turn may still take.
export function askPause() {
  const dialog = $("#pause-dialog");
  $("#pause-reason").value = "";
  dialog.returnValue = "";
  dialog.showModal();
  $("#pause-reason").focus();
}

export function wireViews() {
  // Cancel is not the form's submit button: Enter in the reason pauses.
  $("#pause-cancel").addEventListener("click", () => $("#pause-dialog").close("cancel"));
  $("#pause-dialog").addEventListener("close", () => {
    const dialog = $("#pause-dialog");
    if (dialog.returnValue !== "pause") return;
    const reason = $("#pause-reason").value.trim();
    const seconds = Number($("#pause-wait").value);
    const params = { session_id: state.open, reason: reason || undefined };
    if (Number.isFinite(seconds) && seconds >= 0) params.force_after_ms = Math.round(seconds * 1000);
    actOnSession("task.session.pause", undefined, params);
  });
  for (const button of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll(".tabs button"))) {
    button.addEventListener("click", () => showTab(button.dataset.tab));
    button.addEventListener("keydown", onTabKey);
  }
  wireTurns();
}

// ---- windows of a long session ---------------------------------------------------------

// Events a window holds: 500, or (for tests of the windows' edges, and small devices)
// what `sessionStorage["tether-window"]` says; that setting also caps what one "Show
// earlier" reads, else a turn's rest (at most 5,000 events) comes at once.
export const WINDOW_SET = Number(sessionStorage.getItem("tether-window")) || 0;
export const WINDOW = WINDOW_SET || 500;
export const LOAD_CAP = WINDOW_SET || 5000;

// Opens the session at its newest WINDOW events (a session with 220,000 events opens as
// fast as one with 500); false when that failed (the error is shown).
export async function loadNewest(sessionId, visit) {
  const turns = readTurns(sessionId);
  let window;
  try {
    window = await rpc.call("task.session.event_window", { session_id: sessionId, limit: WINDOW });
  } catch (error) {
    if (state.visit === visit) sessionError(error);
    return false;
  }
  if (state.visit !== visit) return false;
  let events;
  try {
    events = await wholeMessages(sessionId, window);
  } catch (error) {
    if (state.visit === visit) sessionError(error);
    return false;
  }
  state.turns = await turns;
  if (state.visit !== visit) return false;
  state.keptAfter = window.kept_after_seq;
  state.windowStart = events.length ? events[0].seq : window.last_seq + 1;
  state.lastSeq.set(sessionId, events.length ? events[events.length - 1].seq : window.last_seq);
  for (const event of events) render(event);
  await pinNewestPrompt(sessionId, visit);
  if (state.visit !== visit) return false;
  showEarlier();
  renderTurnNav();
  if ($("#usage").hidden) usageFromSnapshot(sessionId, visit);
  return true;
}

// A window's events, taken back to the start of the message they begin inside (the events
// before them, down to the one that ended the message before), so that no message is ever
// rendered in two parts: its Markdown cut in two would show code as prose and a fence as
// text.
export async function wholeMessages(sessionId, window) {
  let events = window.events;
  while (events.length && events[0].seq > window.kept_after_seq + 1 && startsInsideMessage(events)) {
    const earlier = await rpc.call("task.session.event_window",
      { session_id: sessionId, before_seq: events[0].seq, limit: Math.max(WINDOW, 500) });
    const before = earlier.events.filter((event) => event.seq < events[0].seq);
    if (!before.length) break;
    const start = messageStart(before);
    events = before.slice(start).concat(events);
    if (start > 0) break; // the message's start
  }
  return events;
}

// The agent's last reported usage, when it is older than the window shown: its newest
// snapshot has it.
export async function usageFromSnapshot(sessionId, visit) {
  try {
    const snapshots = await rpc.call("task.session.snapshot.list", { session_id: sessionId });
    const newest = snapshots.filter((s) => s.context_size).pop();
    if (!newest || state.visit !== visit || !$("#usage").hidden) return;
    const { usage } = await rpc.call("task.session.snapshot.get", { snapshot_id: newest.snapshot_id });
    if (state.visit !== visit || !$("#usage").hidden) return;
    const cost = typeof usage.cost === "number" ? { amount: usage.cost, currency: usage.cost_currency } : undefined;
    renderUsage({ used: usage.context_used, size: usage.context_size, cost });
  } catch (error) {
    // Usage is a nicety: a session without snapshots shows none.
  }
}

// The agent's questions still waiting, asked before the window shown: offered at the end
// (the status lists them; one already shown, or answered since, is left as it is).
export function offerOpenQuestions(status) {
  const seq = state.lastSeq.get(state.open) || 0;
  for (const question of status.open_questions || []) {
    if (state.permissions.has(question.request_id)) continue;
    const event = { request_id: question.request_id, params: question.params, seq };
    if (question.method === "elicitation/create") renderElicitation({ type: "elicitation_request", ...event });
    else renderPermission({ type: "permission_request", ...event });
  }
}

// The transcript's top: a button for the window before (also pressed by scrolling to the
// top), or, once the log's start is reached, what the log no longer keeps.
export function showEarlier() {
  const box = $("#transcript");
  for (const old of box.querySelectorAll(".earlier")) old.remove();
  let top = null;
  if (state.windowStart > state.keptAfter + 1) {
    top = el("button", { class: "earlier quiet", onclick: loadEarlier }, nextEarlier().label);
  } else if (state.keptAfter > 0) {
    top = el("div", { class: "earlier notice" },
      "Earlier events of this session are no longer kept for the page; the History tab has the whole conversation.");
  }
  if (!top) return;
  // Under the newest prompt when it is pinned: what loads goes between the two.
  const pin = box.querySelector(":scope > .pinned");
  if (pin) pin.after(top);
  else box.prepend(top);
}

// What "Show earlier" reads next and says (turns.js): the rest of the turn the window
// starts inside, or the turn before, by turn; by count where no turn says where it starts.
export function nextEarlier() {
  const left = state.windowStart - state.keptAfter - 1;
  const byCount = { limit: Math.min(WINDOW, left), label: `Show earlier events (${left} more)` };
  const step = Turns.earlierStep(state.turns, state.windowStart, state.keptAfter, LOAD_CAP);
  return step.turn ? step : byCount;
}

// The session's turns from its timeline (numbered; where each starts in the log), or
// none when that cannot be read: the page then loads by count, as before.
export async function readTurns(sessionId) {
  try {
    const timeline = await rpc.call("task.session.timeline",
      { session_id: sessionId, after: Number.MAX_SAFE_INTEGER });
    return Turns.numbered(timeline.turns);
  } catch (_) {
    return [];
  }
}

// A window that starts inside the newest turn shows that turn's prompt first, pinned
// above the button that loads the rest of the turn: a long session opens with the newest
// prompt in view. (Gone once the rest is loaded: the prompt is then in its place.)
export async function pinNewestPrompt(sessionId, visit) {
  const turn = Turns.newest(state.turns);
  if (!turn || turn.seq >= state.windowStart || turn.seq <= state.keptAfter) return;
  let start;
  try {
    start = await rpc.call("task.session.event_window",
      { session_id: sessionId, before_seq: turn.seq + 1, limit: 1 });
  } catch (_) {
    return; // the button still loads the turn
  }
  const event = start.events[0];
  if (state.visit !== visit || !event || event.seq !== turn.seq || event.type !== "turn_started"
    || event.turn_id !== turn.id) return;
  const held = renderHeld([event]);
  if (turn.seq === state.windowStart - 1) {
    // Only the prompt was left out: the window starts at it.
    const prompt = held.firstElementChild;
    $("#transcript").prepend(held);
    if (prompt) markCurrent(prompt);
    state.windowStart = turn.seq;
    return;
  }
  const pin = el("div", { class: "pinned current", title: `turn ${turn.n}: its prompt; its start is above the button` });
  pin.append(held);
  $("#transcript").prepend(pin);
  state.pinned = turn.seq;
}

// `events`, rendered apart from the live transcript (into a holder returned), as an
// earlier window is.
export function renderHeld(events) {
  const saved = { agent: state.currentAgent, thought: state.currentThought, plan: state.plan };
  const holder = document.createDocumentFragment();
  state.backfill = holder;
  state.backfillTurn = null;
  state.backfillBlocks.clear();
  state.currentAgent = state.currentThought = state.plan = null;
  try {
    for (const event of events) render(event);
    for (const block of state.backfillBlocks) block.replaceChildren(markdown(block.raw));
  } finally {
    state.backfill = null;
    state.backfillBlocks.clear();
    state.currentAgent = saved.agent;
    state.currentThought = saved.thought;
    state.plan = saved.plan;
  }
  return holder;
}

// What the transcript shows before its first turn's prompt: the end of a turn that began
// in an earlier window.
export function headOfTranscript() {
  const head = [];
  for (const node of $("#transcript").children) {
    if (node.classList.contains("pinned") || node.classList.contains("earlier")) continue;
    if (node.classList.contains("user")) break;
    head.push(node);
  }
  return head;
}

// Renders the window before the oldest shown into a holder, then puts it on top, keeping
// what the reader sees where it is.
export async function loadEarlier() {
  const sessionId = state.open;
  const visit = state.visit;
  // Once the newest window is shown (its button is there from then on), not only once the
  // session is followed: a click while the opening finishes is not dropped.
  if (state.loadingEarlier || !state.windowStart || state.windowStart <= state.keptAfter + 1) return false;
  state.loadingEarlier = true;
  try {
    const bound = state.windowStart;
    const window = await rpc.call("task.session.event_window",
      { session_id: sessionId, before_seq: bound, limit: nextEarlier().limit });
    if (state.visit !== visit) return false;
    state.keptAfter = window.kept_after_seq;
    // Only what lies before the oldest shown (the daemon says so too; a page trusts it
    // not to loop), from the start of the message it begins inside.
    window.events = window.events.filter((event) => event.seq < bound);
    const events = await wholeMessages(sessionId, window);
    if (state.visit !== visit) return false;
    const holder = renderHeld(events);
    state.windowStart = events.length ? events[0].seq : state.keptAfter + 1;
    // A plan is the whole plan: where the turn the window ends in goes on below with a
    // newer one, the window's older one goes.
    const newerPlan = headOfTranscript().some((node) => node.classList.contains("plan"));
    const lastTurn = [...holder.children].reverse().findIndex((node) => node.classList.contains("user"));
    const tail = lastTurn < 0 ? [...holder.children] : [...holder.children].slice(holder.children.length - lastTurn);
    if (newerPlan) for (const node of tail) if (node.classList.contains("plan")) node.remove();
    const box = $("#transcript");
    if (state.pinned && state.windowStart <= state.pinned) {
      // The pinned prompt is in what loaded now, in its place.
      box.querySelector(":scope > .pinned")?.remove();
      state.pinned = null;
    }
    const first = box.querySelector(".earlier");
    joinNotices(holder, first ? first.nextElementSibling : box.firstElementChild);
    const before = box.scrollHeight;
    if (first) first.after(holder);
    else box.prepend(holder);
    box.scrollTop += box.scrollHeight - before;
    showEarlier();
    return true;
  } catch (error) {
    sessionError(error);
    return false;
  } finally {
    if (state.visit === visit) state.loadingEarlier = false;
  }
}

// ---- turns: the navigator and the search ----------------------------------------------

// The turn list over the transcript: each turn by number, time and prompt; choosing one
// brings its prompt into view, loading back to it.
export function renderTurnNav() {
  const select = $("#turn-nav");
  const known = state.turns.filter((turn) => turn.seq !== undefined || select.value === turn.id);
  const options = known.map((turn) => {
    const time = turn.startedAt ? new Date(turn.startedAt).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : "";
    const text = `${turn.n} · ${time} · ${Turns.shortly(turn.prompt || "(no prompt)")}${turn.rewound ? " (rewound)" : ""}`;
    return el("option", { value: turn.id }, text);
  });
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "" }, `Go to a turn (${known.length})`), ...options);
  select.value = known.some((turn) => turn.id === chosen) ? chosen : "";
  $("#transcript-tools").hidden = state.turns.length === 0;
}

// Brings turn `turnId` into view — loading back to its start where it is older than what
// is shown — and, with `query`, the first of its parts that holds it, marked.
export async function goToTurn(turnId, query) {
  const visit = state.visit;
  const box = $("#transcript");
  const prompt = () => box.querySelector(`.user[data-turn="${CSS.escape(turnId)}"]`);
  const turn = state.turns.find((t) => t.id === turnId);
  const target = turn && turn.seq !== undefined ? turn.seq : state.keptAfter + 1;
  while (!prompt() && state.visit === visit && state.windowStart > Math.max(target, state.keptAfter + 1)) {
    if (!(await loadEarlier())) break;
  }
  if (state.visit !== visit) return;
  for (const old of box.querySelectorAll(".hit")) old.classList.remove("hit");
  const needle = (query || "").trim().toLowerCase();
  const parts = [...box.querySelectorAll(`[data-in-turn="${CSS.escape(turnId)}"]`)];
  const node = (needle && parts.find((part) => part.textContent.toLowerCase().includes(needle))) || prompt();
  if (!node) {
    activity(`turn ${turn ? turn.n : turnId} is no longer kept for the page; the History tab has it`);
    return;
  }
  node.classList.add("hit");
  state.stick = false;
  node.scrollIntoView({ block: needle ? "center" : "start" });
}

// Searches the whole conversation (its history, read a page at a time) and lists each
// match by turn; choosing one goes to it.
export async function searchTranscript(query) {
  const sessionId = state.open;
  const visit = state.visit;
  const list = $("#search-results");
  list.hidden = false;
  list.replaceChildren(el("li", { class: "muted" }, "searching…"));
  const entries = [];
  try {
    for (let after = 0; ;) {
      const page = await rpc.call("task.session.history", { session_id: sessionId, after_seq: after, limit: 1000 });
      entries.push(...page);
      if (page.length < 1000) break;
      after = page[page.length - 1].seq;
    }
  } catch (error) {
    if (state.visit === visit) list.replaceChildren(el("li", { class: "error" }, `cannot search: ${error.message}`));
    return;
  }
  if (state.visit !== visit) return;
  const found = Turns.searchHistory(entries, query);
  const numberOf = (id) => state.turns.find((turn) => turn.id === id)?.n;
  list.replaceChildren(...found.map((match) => el("li", {},
    el("button", { type: "button", class: "quiet", onclick: () => goToTurn(match.turnId, query) },
      el("span", { class: "muted" }, numberOf(match.turnId) ? `turn ${numberOf(match.turnId)} · ` : "before the first turn · "),
      match.excerpt))));
  if (!found.length) list.replaceChildren(el("li", { class: "muted" }, `Nothing in this conversation says “${query.trim()}”.`));
  list.setAttribute("aria-label", `${found.length} match(es) for ${query.trim()}`);
}

export function wireTurns() {
  $("#turn-nav").addEventListener("change", (event) => {
    if (event.target.value) goToTurn(event.target.value);
  });
  $("#search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const query = $("#search-text").value;
    if (query.trim()) searchTranscript(query);
  });
}

// ---- the agent's settings: its model and other options, its mode ----------------------

// Shown under the session's head: a choice per select option (the model among them), a
// switch per boolean one, and the mode; a change is sent at once (the agent answers) and
// kept across resumes. A choice the agent did not take again says so.
export async function refreshSettings() {
  const sessionId = state.open;
  if (!sessionId) return;
  let config;
  try {
    config = await rpc.call("task.session.config_options", { session_id: sessionId });
  } catch (_) {
    return; // the next status or update shows them
  }
  if (state.open !== sessionId) return;
  const box = $("#settings");
  const choose = (method, params) => async (event) => {
    const target = event.currentTarget;
    target.disabled = true;
    try {
      await rpc.call(method, { session_id: sessionId, ...params(target) });
    } catch (error) {
      sessionError(error);
    }
    refreshSettings();
  };
  const controls = [];
  for (const option of config.config_options) {
    const label = option.name || option.id;
    if (option.type === "boolean") {
      const input = el("input", { type: "checkbox", onchange: choose("task.session.set_config_option", (t) => ({ config_id: option.id, value: t.checked })) });
      input.checked = option.currentValue === true;
      controls.push(el("label", { class: "setting", title: option.description || "" }, input, ` ${label}`));
    } else if (option.type === "select") {
      const items = [];
      for (const item of option.options || []) {
        if (Array.isArray(item.options)) {
          items.push(el("optgroup", { label: item.name || item.group }, ...item.options.map((o) => el("option", { value: o.value }, o.name || o.value))));
        } else {
          items.push(el("option", { value: item.value }, item.name || item.value));
        }
      }
      const select = el("select", { "aria-label": label, "data-setting": option.id, onchange: choose("task.session.set_config_option", (t) => ({ config_id: option.id, value: t.value })) }, ...items);
      select.value = option.currentValue;
      controls.push(el("label", { class: "setting", title: option.description || "" }, `${label} `, select));
    }
  }
  const modes = config.modes;
  if (modes && Array.isArray(modes.availableModes) && modes.availableModes.length) {
    const select = el("select", { "aria-label": "mode", "data-setting": "mode", onchange: choose("task.session.set_mode", (t) => ({ mode_id: t.value })) },
      ...modes.availableModes.map((mode) => el("option", { value: mode.id, title: mode.description || "" }, mode.name || mode.id)));
    select.value = modes.currentModeId;
    controls.push(el("label", { class: "setting" }, "Mode ", select));
  }
  if (config.blocked) controls.push(el("span", { class: "setting blocked", role: "alert" }, config.blocked));
  box.replaceChildren(...controls);
  box.hidden = controls.length === 0;
}
