// @ts-check
// Tether's web UI: one page over the daemon's JSON-RPC WebSocket API (docs/api.md).
// No framework and no build step: ES modules served as they are, embedded in the binary;
// this one is the page's entry (index.html loads it; it imports the rest). `tsc` checks
// them all (tsconfig.json: `// @ts-check`, JSDoc types), `node --test` runs the pure ones'
// tests (tests/).
//
// Opening a session follows the frontend contract: task.session.status; if needs_resume,
// one task.session.resume per page visit, with a "resuming…" indicator, then the outcome.
// Events are rendered by seq: after a reconnect (the daemon restarted) the page
// resubscribes after the last seq it rendered, so nothing is shown twice or missed.
import * as Changes from "./changes.js";
import { followList, renderForms, renderLists, setBadge, updateNeedsYou, wireList } from "./list.js";
import { needsYou, reconcile } from "./lists.js";
import { $, diffView, el, markdown, render, renderTotals, showWorking, stickToBottom } from "./render.js";
import { rewindForEdit, showRewound, stopEditing } from "./rewind.js";
import { confinementLabel } from "./sandbox.js";
import { state } from "./state.js";
import { askPause, loadEarlier, loadNewest, offerOpenQuestions, refreshSettings, showDrift, showTab, wireViews } from "./views.js";

export function hex(text) {
  return Array.from(new TextEncoder().encode(text), (b) => b.toString(16).padStart(2, "0")).join("");
}

// ---- the connection --------------------------------------------------------------------

export class Rpc {
  constructor(onOpen, onClose) {
    this.nextId = 1;
    this.pending = new Map();
    this.handlers = new Map();
    this.onOpen = onOpen;
    this.onClose = onClose;
    this.delay = 250;
    /** Called when the daemon refuses the page's token. @type {(() => void) | null} */
    this.onRefused = null;
  }

  connect() {
    const token = sessionStorage.getItem("tether-token");
    const protocols = ["tether"];
    // Never in the URL: the token travels as a WebSocket subprotocol entry.
    if (token) protocols.push("tether-token." + hex(token));
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/";
    const ws = new WebSocket(url, protocols);
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.refusals = 0;
      this.delay = 250;
      this.onOpen();
    };
    ws.onmessage = (message) => this.receive(JSON.parse(message.data));
    ws.onclose = async () => {
      for (const { reject } of this.pending.values()) reject(new Error("the connection closed"));
      this.pending.clear();
      this.handlers.clear();
      this.onClose();
      // Refused before it opened, with a token, by a daemon that serves this page — twice,
      // so a daemon that came up between the two is not taken for a refusal: the token is
      // wrong, and trying it again would loop forever. Ask for another.
      if (!opened && token && (await this.serving())) {
        this.refusals = (this.refusals || 0) + 1;
        if (this.refusals >= 2) {
          this.refusals = 0;
          this.onRefused();
          return;
        }
        setTimeout(() => this.connect(), 0);
        return;
      }
      this.refusals = 0;
      // Reconnect with a growing delay (at most 5 s): the daemon may be restarting.
      setTimeout(() => this.connect(), this.delay);
      this.delay = Math.min(this.delay * 2, 5000);
    };
  }

  // Whether the daemon answers (the page needs no token).
  async serving() {
    try {
      return (await fetch("/", { cache: "no-store" })).ok;
    } catch (error) {
      return false;
    }
  }

  receive(message) {
    if (message.id !== undefined && this.pending.has(message.id)) {
      const { resolve, reject } = this.pending.get(message.id);
      this.pending.delete(message.id);
      if (message.error) {
        const error = /** @type {Error & { kind?: string }} */ (new Error(message.error.message));
        error.kind = message.error.data && message.error.data.kind;
        reject(error);
      } else {
        resolve(message.result);
      }
      return;
    }
    const streams = ["task.session.event", "task.session.events", "sessions.event", "workflows.event"];
    if (streams.includes(message.method) && message.params) {
      const handler = this.handlers.get(String(message.params.subscription));
      if (handler) handler(message.params.result);
    }
  }

  call(method, params = {}) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
      return Promise.reject(new Error("not connected to the daemon"));
    }
    const id = this.nextId++;
    this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
  }

  async subscribeList(handler) {
    const id = await this.call("sessions.subscribe");
    this.handlers.set(String(id), handler);
    return id;
  }

  async subscribeWorkflows(handler) {
    const id = await this.call("workflows.subscribe");
    this.handlers.set(String(id), handler);
    return id;
  }

  // Ends a subscription: its handler goes first, so nothing it still delivers is seen.
  unsubscribe(id, method = "task.session.unsubscribe") {
    this.handlers.delete(String(id));
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      const request = this.nextId++;
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id: request, method, params: [id] }));
    }
  }

  // A session's events in batches (one frame for what was ready at once): `handler` gets
  // each event.
  async subscribeBatches(sessionId, afterSeq, handler) {
    const id = await this.call("task.session.subscribe_batch", { session_id: sessionId, after_seq: afterSeq });
    this.handlers.set(String(id), (events) => events.forEach(handler));
    return id;
  }

  async subscribe(sessionId, afterSeq, handler) {
    const id = await this.call("task.session.subscribe", { session_id: sessionId, after_seq: afterSeq });
    this.handlers.set(String(id), handler);
    return id;
  }
}


export const rpc = new Rpc(onConnected, onDisconnected);
rpc.onRefused = () => {
  sessionStorage.removeItem("tether-token");
  const badge = $("#connection");
  badge.textContent = "token refused";
  badge.className = "badge offline";
  $("#token-note").textContent = "The daemon refused this token. Enter it again.";
  $("#token-form").hidden = false;
};

export function showError(error) {
  const box = $("#error");
  if (!error) {
    box.hidden = true;
    box.textContent = "";
    return;
  }
  box.hidden = false;
  box.textContent = error.kind ? `${error.kind}: ${error.message}` : error.message;
}

// A line of the session's activity, at `at` (an event's Unix ms; now for the page's own);
// the line, or nothing while an earlier window is rendered.
export function activity(text, at = Date.now()) {
  if (state.backfill) return; // an earlier window's activity is history (the Timeline tab)
  const item = el("li", { "data-at": String(at) }, `${new Date(at).toLocaleTimeString()} ${text}`);
  $("#activity").append(item);
  $("#activity").scrollTop = $("#activity").scrollHeight;
  return item;
}

// ---- lists -----------------------------------------------------------------------------

export async function refreshLists() {
  await Promise.all([followList(), followWorkflows()]);
  const [tasks, sessions, agents] = await Promise.all([
    rpc.call("task.list"),
    rpc.call("task.session.list", {}),
    rpc.call("agents.list"),
    listWorkflows(),
  ]);
  state.tasks = tasks;
  state.sessions = sessions;
  state.agents = agents;
  renderLists();
}

// ---- workflows ---------------------------------------------------------------------------

// The workflow list follows one `workflows.subscribe`: a workflow created or changed
// anywhere (the CLI, another page) comes as its summary — steps done, steps waiting for
// approval — a deleted one goes, and a gap lists them all again. The open workflow's steps
// are read again whenever its summary changes.
export async function followWorkflows() {
  if (state.workflowsFollowed) return;
  state.workflowsFollowed = true;
  try {
    await rpc.subscribeWorkflows(onWorkflowsEvent);
  } catch (error) {
    state.workflowsFollowed = false;
    showError(error);
  }
}

// While the list is being read, changes wait: the list may be older than they are.
export function onWorkflowsEvent(event) {
  if (state.workflowsHeld) state.workflowsHeld.push(event);
  else applyWorkflowsEvent(event);
}

export function applyWorkflowsEvent(event) {
  if (event.type === "changed") {
    showWorkflow(event.workflow);
  } else if (event.type === "deleted") {
    state.workflows = state.workflows.filter((w) => w.workflow_id !== event.workflow_id);
    renderWorkflows();
    updateNeedsYou();
  } else if (event.type === "resync") {
    listWorkflows();
  }
}

// The workflows as listed (subscribed first, so nothing falls between), then the changes
// that came while the list was read. A listing under way is not started again: the changes
// after it are applied to it.
export async function listWorkflows() {
  if (state.workflowsHeld) return;
  state.workflowsHeld = [];
  try {
    state.workflows = await rpc.call("workflow.list");
  } catch (error) {
    // The next connection lists them again.
  }
  const held = state.workflowsHeld;
  state.workflowsHeld = null;
  renderWorkflows();
  updateNeedsYou();
  held.forEach(applyWorkflowsEvent);
}

// A workflow's summary, unless the page has a newer one (its newest event's seq grows with
// each change).
export function showWorkflow(workflow) {
  const index = state.workflows.findIndex((w) => w.workflow_id === workflow.workflow_id);
  if (index < 0) state.workflows.push(workflow);
  else if (state.workflows[index].last_event_seq <= workflow.last_event_seq) state.workflows[index] = workflow;
  else return;
  renderWorkflows();
  updateNeedsYou();
  if (state.openWorkflow === workflow.workflow_id) refreshWorkflow(workflow.workflow_id);
}

// A workflow needs a person when a step of it waits for approval.
export function workflowNeedsYou(workflow) {
  return workflow.state === "running" && workflow.waiting_approval.length > 0;
}

export function renderWorkflows() {
  reconcile($("#workflows"), state.workflows, (workflow) => workflow.workflow_id,
    (workflow) => JSON.stringify([workflow, workflow.workflow_id === state.openWorkflow]),
    (workflow) => {
      const flagged = workflowNeedsYou(workflow);
      const why = `${workflow.waiting_approval.join(", ")} waits for approval`;
      return el(
        "li",
        {
          class: (workflow.workflow_id === state.openWorkflow ? "open" : "") + (flagged ? " needs-you" : ""),
          "data-workflow": workflow.workflow_id,
          onclick: () => openWorkflow(workflow.workflow_id),
        },
        el("span", { class: `badge ${workflow.state}` }, workflow.state),
        el("span", { class: "workflow-name" }, `${workflow.name} · ${workflow.steps_done}/${workflow.steps} steps`),
        flagged ? el("span", { class: "needs-you-flag", title: why }, "needs you") : "",
      );
    });
  $("#workflows-section").hidden = state.workflows.length === 0;
}

export async function refreshWorkflow(workflowId) {
  try {
    const status = await rpc.call("workflow.status", { workflow_id: workflowId });
    // Answers may cross: an older status than the one shown is dropped.
    if (state.openWorkflow === workflowId && status.last_event_seq >= state.workflowSeq) renderWorkflow(status);
  } catch (error) {
    // Deleted, or the connection went: the list says so, or the next connection reads it.
  }
}

export async function openWorkflow(workflowId) {
  location.hash = "#/workflow/" + workflowId;
  state.openWorkflow = workflowId;
  $("#workflow").hidden = false;
  $("#workflow-review").hidden = true; // another workflow's review is not this one's
  $("#welcome").hidden = true;
  renderWorkflows();
  try {
    renderWorkflow(await rpc.call("workflow.status", { workflow_id: workflowId }));
  } catch (error) {
    showError(error);
  }
}

export function renderWorkflow(status) {
  state.workflowSeq = status.last_event_seq;
  $("#workflow-title").textContent = `${status.name} · ${status.workflow_id}`;
  const badge = $("#workflow-state");
  // A paused session says what paused it: parked (idle: the next message wakes it), a
  // budget used up, a turn or time limit.
  const pausedBy = status.state === "PAUSED" && status.paused_by && status.paused_by !== "pause" ? status.paused_by : "";
  badge.textContent = pausedBy ? `${status.state} · ${pausedBy === "idle" ? "parked" : pausedBy.replace("_", " ")}` : status.state;
  badge.title = pausedBy === "idle" ? `parked ${new Date(status.paused_at).toLocaleString()} while idle; your next message wakes it` : "";
  badge.className = `badge ${status.state}`;
  const error = $("#workflow-error");
  error.hidden = !status.error;
  error.textContent = status.error || "";
  $("#workflow-resume").disabled = !(status.state === "failed" || status.state === "cancelled");
  $("#workflow-cancel").disabled = status.state !== "running";
  // A run view: one lane per stage (a step stands one lane after the last step it waits
  // for), each step with its state and time, its session and its changes a click away.
  // Updated in place: a lane stays the node it was, and so does a step's card until the
  // step changes (the focus and what a person reads stay where they are).
  const lanes = stepLanes(status.steps).map((steps, at) => ({ at, steps }));
  const holder = $("#steps");
  reconcile(holder, lanes, (lane) => String(lane.at), () => "",
    (lane) => el("ol", { class: "lane", "aria-label": `stage ${lane.at + 1}` }));
  lanes.forEach((lane, at) => reconcile(holder.children[at], lane.steps, (step) => step.id,
    (step) => JSON.stringify([status.workflow_id, step, stepTime(step)]), (step) => stepCard(status, step)));
}

// The steps by stage: a step with no dependency is in the first lane, any other one lane
// after the latest of the steps it waits for (a dependency outside the list counts as none).
export function stepLanes(steps) {
  const byId = new Map(steps.map((step) => [step.id, step]));
  const level = new Map();
  const levelOf = (step, seen = new Set()) => {
    if (level.has(step.id)) return level.get(step.id);
    if (seen.has(step.id)) return 0; // a loop goes back: it does not push a lane further
    seen.add(step.id);
    const deps = step.depends_on.map((id) => byId.get(id)).filter(Boolean);
    const at = deps.length ? 1 + Math.max(...deps.map((dep) => levelOf(dep, seen))) : 0;
    level.set(step.id, at);
    return at;
  };
  const lanes = [];
  for (const step of steps) {
    const at = levelOf(step);
    (lanes[at] = lanes[at] || []).push(step);
  }
  return lanes.filter(Boolean);
}

// How long a step took, or has run so far.
export function stepTime(step) {
  if (!step.started_at) return "";
  const ms = (step.ended_at || Date.now()) - step.started_at;
  const took = ms < 1000 ? `${ms} ms` : ms < 120000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 60000)} min`;
  return step.ended_at ? took : `running for ${took}`;
}

export function stepCard(status, step) {
  const head = el(
    "div",
    { class: "step-head" },
    el("span", { class: "step-id" }, step.id),
    el("span", { class: `badge ${step.state}`, "data-step": step.id }, step.state.replace("_", " ")),
    step.runs > 1 ? el("span", { class: "muted" }, `run ${step.runs}`) : "",
    step.started_at ? el("span", { class: "muted step-time" }, stepTime(step)) : "",
    step.depends_on.length ? el("span", { class: "deps" }, `after ${step.depends_on.join(", ")}`) : "",
  );
  const actions = el("div", { class: "step-actions" });
  if (step.session_id) {
    actions.append(el("button", { class: "open-session", onclick: () => openSession(step.session_id) }, "Open session"));
    actions.append(el("button", { class: "review-step", onclick: () => {
      openSession(step.session_id);
      showTab("changes");
    } }, "Changes"));
  }
  if (step.state === "waiting_approval") {
    actions.append(
      el("button", {
        class: "approve",
        onclick: () => act("workflow.approve", { workflow_id: status.workflow_id, step_id: step.id }),
      }, "Approve"),
    );
  }
  const parts = [head];
  if (actions.childElementCount) parts.push(actions);
  if (step.output) parts.push(el("div", { class: "output" }, step.output));
  if (step.error) parts.push(el("div", { class: "output error" }, step.error));
  return el("li", { class: `step ${step.state}`, "data-step-row": step.id }, ...parts);
}

// ---- a session -------------------------------------------------------------------------

export async function openSession(sessionId) {
  if (sessionId !== state.open) showDrift(null);
  location.hash = "#/session/" + sessionId;
  state.open = sessionId;
  state.visit += 1; // what an answer for an earlier opening must not touch
  state.live = false;
  state.windowStart = 0; // no window of this opening shown yet
  state.loadingEarlier = false;
  state.lastSeq.set(sessionId, 0);
  state.currentAgent = null;
  state.currentThought = null;
  state.tools.clear();
  state.permissions.clear();
  state.plan = null;
  state.answers.clear();
  state.lastTurnEnd = 0;
  state.stick = true;
  state.unseen.delete(sessionId);
  $("#jump").hidden = true;
  $("#usage").hidden = true;
  $("#totals").hidden = true;
  $("#session").hidden = false;
  $("#welcome").hidden = true;
  $("#transcript").replaceChildren();
  state.liveTurn = null;
  state.turns = [];
  state.pinned = null;
  $("#search-results").replaceChildren();
  $("#search-results").hidden = true;
  $("#transcript-tools").hidden = true;
  stopEditing();
  $("#activity").replaceChildren();
  $("#session-error").hidden = true;
  $("#settings").hidden = true;
  $("#session-title").textContent = sessionId;
  renderLists();
  Changes.reset(sessionId);
  showTab("transcript");
  const visit = state.visit;
  let status;
  try {
    status = await rpc.call("task.session.status", { session_id: sessionId });
  } catch (error) {
    if (state.visit === visit) sessionError(error);
    return undefined;
  }
  if (state.visit !== visit) return undefined; // opened again, or another session
  renderStatus(status);
  refreshSettings();
  $("#forked-conversation").hidden = true;
  if (status.forked_from) showForkedConversation(sessionId, status.forked_from, visit);
  // The newest window of its events first (a long session opens at its end; older ones
  // load as the reader scrolls up), then the events after it, live.
  if (!(await loadNewest(sessionId, visit)) || state.visit !== visit) return;
  await showRewound(sessionId, visit);
  offerOpenQuestions(status);
  state.live = true;
  await follow(sessionId);
  // Opening a session brings back only an agent that died under a session waiting for
  // input; a PAUSED or FAILED one (or one that cannot be resumed now) waits for its
  // Resume button.
  // (A fork at rest, never started, waits for its first prompt: it costs nothing till then.)
  const lost = status.state === "WAITING_FOR_INPUT" && status.is_resumable
    && status.resume_reason !== "not_started";
  if (status.needs_resume && lost && !state.resumedThisVisit.has(sessionId)) {
    state.resumedThisVisit.add(sessionId);
    await resume(sessionId);
  }
}

export async function resume(sessionId) {
  $("#resume-indicator").hidden = false;
  activity("resuming…");
  try {
    const result = await rpc.call("task.session.resume", { session_id: sessionId });
    activity(`resumed: ${result.outcome}`);
    $("#session-state").dataset.outcome = result.outcome;
    showDrift(result.git_drift);
  } catch (error) {
    activity(`resume failed: ${error.message}`);
    sessionError(error);
  } finally {
    $("#resume-indicator").hidden = true;
  }
}

// One subscription renders the open session: the one before is ended first, and any event
// it still delivers is dropped, so it can never move `lastSeq` past a replay in flight.
export async function follow(sessionId) {
  if (state.following) {
    rpc.unsubscribe(state.following.id, "task.session.unsubscribe_batch");
    state.following = null;
  }
  const token = ++state.followToken;
  const after = state.lastSeq.get(sessionId) || 0;
  try {
    const id = await rpc.subscribeBatches(sessionId, after, (event) => {
      if (token !== state.followToken || state.open !== sessionId) return;
      const last = state.lastSeq.get(sessionId) || 0;
      if (event.seq <= last) return; // already rendered (a resubscribe's overlap)
      state.lastSeq.set(sessionId, event.seq);
      render(event);
      if (state.live) Changes.onEvent(event);
    });
    if (token === state.followToken) {
      state.following = { id, token };
    } else {
      rpc.unsubscribe(id, "task.session.unsubscribe_batch"); // another session was opened meanwhile
    }
  } catch (error) {
    sessionError(error);
  }
}

export function renderStatus(status) {
  const branch = status.worktree_branch ? ` · ${status.worktree_branch}` : "";
  const placement = status.placement ? ` · on ${status.placement}` : "";
  // The work first (its task's title), then what runs it.
  const task = state.tasks.find((t) => t.id === status.task_id);
  const sandbox = confinementLabel(status.sandbox);
  $("#session-title").replaceChildren(task ? task.title : "a session",
    el("span", { class: "muted session-sub" }, ` · ${status.agent_profile_id} · ${status.session_id}${branch}${placement}`),
    el("span", { class: `sandbox-chip${status.sandbox ? "" : " unconfined"}`, title: sandbox.title }, sandbox.text));
  showWorking(status.state);
  const badge = $("#session-state");
  badge.textContent = status.state;
  badge.className = `badge ${status.state}`;
  setBadge(status.session_id, status.state);
  renderTotals(status.usage);
  renderQueue(status.queue);
  renderForkedFrom(status.forked_from);
  showActions(status.state, status.needs_resume);
  // The status says what is wrong now: an error shown before (a reconnect's, an old
  // action's) goes when it says nothing.
  if (status.error) sessionError(new Error(status.error));
  else $("#session-error").hidden = true;
}

// The open session's totals after a turn's end (its turn row holds them now).
export async function refreshTotals() {
  const sessionId = state.open;
  if (!sessionId) return;
  try {
    const status = await rpc.call("task.session.status", { session_id: sessionId });
    if (state.open === sessionId) renderTotals(status.usage);
  } catch (_) {
    // The next status shows them.
  }
}

// The session's buttons that its state allows: Cancel turn while a turn runs, Pause while
// its agent is up, Resume when it has no agent, Stop until it ended; Delete always.
export function showActions(sessionState, needsResume) {
  const ended = sessionState === "COMPLETED" || sessionState === "CANCELLED";
  const rest = sessionState === "PAUSED" || sessionState === "FAILED";
  $("#cancel").hidden = sessionState !== "RUNNING";
  $("#steer").hidden = sessionState !== "RUNNING";
  $("#pause").hidden = !(sessionState === "RUNNING" || sessionState === "WAITING_FOR_INPUT");
  $("#resume").hidden = ended || !(rest || needsResume === true);
  $("#stop").hidden = ended;
}

// Acts on the open session, then shows its state as the daemon now has it (a stop of a
// session without an agent changes it without an event the page follows).
export async function actOnSession(method, confirmText, params = { session_id: state.open }) {
  const sessionId = state.open;
  const done = await act(method, params, confirmText);
  if (done !== undefined && state.open === sessionId) {
    try {
      const status = await rpc.call("task.session.status", { session_id: sessionId });
      // A status read before events the page has shown since would take them back (a
      // RUNNING badge after the turn's end was shown): the events are newer. So would one
      // read as they were written: events go first, the row after, so a status whose last
      // event the page has shown may still hold the state before it. Only a status that
      // knows of later events says anything new.
      if (status.last_event_seq > (state.lastSeq.get(sessionId) || 0)) renderStatus(status);
    } catch (error) {
      sessionError(error);
    }
  }
  return done;
}

export function sessionError(error) {
  const box = $("#session-error");
  box.hidden = false;
  box.textContent = error.kind ? `${error.kind}: ${error.message}` : error.message;
}

// ---- actions ---------------------------------------------------------------------------

// "zone=a gpu=yes" → {zone: "a", gpu: "yes"}; nothing typed → undefined. A word
// without "=" is sent as a key with an empty value, for the daemon to judge.
export function parseLabels(text) {
  const words = text.split(/\s+/).filter((word) => word);
  if (!words.length) return undefined;
  const labels = {};
  for (const word of words) {
    const at = word.indexOf("=");
    if (at < 0) labels[word] = "";
    else labels[word.slice(0, at)] = word.slice(at + 1);
  }
  return labels;
}

// A turn end's "Fork from here": a new session with the conversation up to that turn.
export function forkButton(turnId) {
  const button = el("button", { type: "button", class: "fork-here", title: "A new session of this task with the conversation up to this turn" }, "Fork from here");
  button.addEventListener("click", () => fork(turnId));
  return button;
}

// Forks the open session (at `turnId`, else its newest turn) and opens the fork, saying
// how its agent gets the conversation and what it could not carry over.
export async function fork(turnId) {
  const forked = await act("task.session.fork", { session_id: state.open, turn_id: turnId || undefined });
  if (!forked) return;
  await refreshLists();
  await openSession(forked.session_id);
  const how = forked.context === "native"
    ? "its agent forks the original's own session when it starts"
    : "the conversation up to that turn goes with its first prompt";
  const branch = forked.branch ? `; branch ${forked.branch}${forked.base_commit ? " from " + forked.base_commit.slice(0, 12) : ""}` : "";
  activity(`forked from ${forked.forked_from} at turn ${forked.turn_id}: ${how}${branch}`);
  for (const note of forked.notes || []) activity(`fork: ${note}`);
}

// A fork's conversation as it was given to it (the original's, up to the turn it was
// forked at), above its own transcript, folded once it has turns of its own.
export async function showForkedConversation(sessionId, link, visit) {
  let entries;
  try {
    entries = await rpc.call("task.session.history", { session_id: sessionId });
  } catch (_) {
    return; // the History tab says why
  }
  if (state.visit !== visit) return;
  const at = entries.findIndex((e) => e.type === "user_message" && e.message_id === link.turn_id);
  if (at < 0) return;
  const after = entries.findIndex((e, i) => i > at && e.type === "user_message"
    && !(e.message_id || "").startsWith(link.turn_id));
  const given = entries.slice(0, after < 0 ? entries.length : after)
    .filter((e) => e.type === "user_message" || e.type === "agent_message");
  const box = $("#forked-conversation");
  box.open = after < 0;
  box.replaceChildren(
    el("summary", {}, `The conversation it was forked with (${given.length} messages, up to turn ${link.turn_id})`),
    ...given.map((e) => e.type === "user_message"
      ? el("div", { class: "user" }, "You: " + e.content)
      : el("div", { class: "agent" }, e.content)),
  );
  box.hidden = false;
}

// The session this one was forked from, with a link to it.
export function renderForkedFrom(link) {
  const box = $("#forked-from");
  box.hidden = !link;
  if (!link) return;
  const open = el("a", { href: `#/session/${link.session_id}` }, link.session_id);
  box.replaceChildren("Forked from ", open, ` at turn ${link.turn_id}`);
}

// Steers the running turn with the prompt box's text: into the turn where the agent takes
// it, else the turn is cancelled and the text runs next (the `steered` event says which).
export async function steer() {
  const text = $("#prompt").value;
  if (!text.trim()) return;
  const steered = await act("task.session.steer", { session_id: state.open, prompt: text });
  if (steered && $("#prompt").value === text) $("#prompt").value = "";
}

// The open session's prompt queue, under the prompt box: each queued prompt with its
// place, to move up or down, edit or remove; and why the queue is halted, to resume it.
export function renderQueue(queue) {
  state.queue = queue;
  const prompts = (queue && queue.prompts) || [];
  const halted = queue && queue.halted;
  $("#queue").hidden = prompts.length === 0 && !halted;
  $("#queue-halted").hidden = !halted;
  $("#queue-halted-why").textContent = halted ? `Queue halted: ${halted}` : "";
  $("#queue .queue-note").hidden = prompts.length === 0;
  const list = $("#queue-list");
  // A prompt being edited keeps its editor (and what was typed) across a re-render.
  const editing = list.querySelector(".queue-editor");
  const kept = editing && editing.closest("li");
  list.replaceChildren(...prompts.map((queued) =>
    kept && kept.dataset.prompt === queued.prompt_id ? kept : queueItem(queued, prompts.length)));
}

export function queueItem(queued, count) {
  // Shown from the session's `queue` events only: they are ordered, and an answer is not
  // (the head may start, and the queue change again, before an answer arrives).
  const change = (params) =>
    act("task.session.queue.edit", { session_id: state.open, prompt_id: queued.prompt_id, ...params });
  const text = el("span", { class: "queued-text", title: queued.prompt }, queued.prompt);
  const up = el("button", { type: "button", title: "run earlier", "aria-label": "move up" }, "↑");
  const down = el("button", { type: "button", title: "run later", "aria-label": "move down" }, "↓");
  const edit = el("button", { type: "button", class: "queue-edit" }, "Edit");
  const remove = el("button", { type: "button", class: "queue-remove", "aria-label": "remove" }, "Remove");
  up.disabled = queued.position <= 1;
  down.disabled = queued.position >= count;
  up.addEventListener("click", () => change({ position: queued.position - 1 }));
  down.addEventListener("click", () => change({ position: queued.position + 1 }));
  remove.addEventListener("click", () =>
    act("task.session.queue.remove", { session_id: state.open, prompt_id: queued.prompt_id }));
  const grip = el("span", { class: "queue-grip", title: "drag to move it", "aria-hidden": "true" }, "⠿");
  const item = el("li", { class: "queued", "data-prompt": queued.prompt_id },
    grip, el("span", { class: "muted" }, `${queued.position}.`), text, up, down, edit, remove);
  dragToReorder(grip, item, (position) => position !== queued.position && change({ position }));
  edit.addEventListener("click", () => {
    const editor = el("textarea", { class: "queue-editor", "aria-label": "the queued prompt's text" });
    editor.value = queued.prompt;
    const save = el("button", { type: "button" }, "Save");
    const cancel = el("button", { type: "button" }, "Cancel");
    save.addEventListener("click", async () => {
      const queue = await act("task.session.queue.edit",
        { session_id: state.open, prompt_id: queued.prompt_id, prompt: editor.value });
      if (!queue) return; // refused: the editor stays, with what was typed
      editor.remove();
      renderQueue(state.queue); // its event shows the new text, if it has not yet
    });
    cancel.addEventListener("click", () => {
      editor.remove();
      renderQueue(state.queue);
    });
    item.replaceChildren(el("span", { class: "muted" }, `${queued.position}.`), editor, save, cancel);
    editor.focus();
  });
  return item;
}

// Dragging a queued prompt by its grip: pointer events (a mouse, a pen or a finger), the
// place it would land marked as it moves; dropped elsewhere, `moved` gets its new place
// (from 1). The buttons beside it do the same from the keyboard.
export function dragToReorder(grip, item, moved) {
  let others = null;
  const landing = (y) => others.filter((other) => {
    const box = other.getBoundingClientRect();
    return box.top + box.height / 2 < y;
  }).length;
  const mark = (at) => others.forEach((other, i) => {
    other.classList.toggle("drop-before", i === at);
    other.classList.toggle("drop-after", at === others.length && i === others.length - 1);
  });
  const end = () => {
    if (!others) return;
    mark(-1);
    item.classList.remove("dragging");
    others = null;
  };
  grip.addEventListener("pointerdown", (event) => {
    if (event.button !== 0 || item.querySelector(".queue-editor")) return;
    event.preventDefault();
    grip.setPointerCapture(event.pointerId);
    others = [...item.parentNode.children].filter((other) => other !== item);
    item.classList.add("dragging");
  });
  grip.addEventListener("pointermove", (event) => {
    if (others) mark(landing(event.clientY));
  });
  grip.addEventListener("pointerup", (event) => {
    if (!others) return;
    const position = landing(event.clientY) + 1;
    end();
    moved(position);
  });
  grip.addEventListener("pointercancel", end);
}

// Single keys, outside a field and a dialog: N opens the next session that needs you,
// A goes to the open session's question (its first answer focused, Enter gives it).
export function onShortcut(event) {
  if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
  const target = event.target;
  if (target.closest?.("input, textarea, select, [contenteditable], dialog") || document.querySelector("dialog[open]")) return;
  const key = event.key.toLowerCase();
  if (key === "n") {
    const waiting = state.sessions.filter((s) => needsYou(s, state.unseen) && s.id !== state.open);
    if (!waiting.length) return activity("nothing else needs you");
    event.preventDefault();
    openSession(waiting[0].id);
  } else if (key === "a") {
    const question = [...state.permissions.values()].find((box) => box.classList.contains("open"));
    const answer = question && question.querySelector("button, input, select");
    if (!answer) return undefined;
    event.preventDefault();
    question.scrollIntoView({ block: "nearest" });
    answer.focus();
  }
  return undefined;
}

// ---- starting work --------------------------------------------------------------------

// One dialog starts work: what the agent should do, the agent, the workspace (recent ones
// offered, any path typed), a worktree or not — the task is made on the way (titled by
// the prompt's first line) unless an existing one is picked.
export function wireNewSession() {
  const dialog = $("#new-session-dialog");
  const form = document.forms["new-session"];
  $("#new-session-open").addEventListener("click", () => {
    $("#new-session-error").hidden = true;
    renderForms();
    dialog.showModal();
    form.elements.prompt.focus();
  });
  $("#new-session-cancel").addEventListener("click", () => dialog.close());
  form.elements.task.addEventListener("change", () => {
    $("#new-title").hidden = form.elements.task.value !== "";
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    startSession(form);
  });
}

// The new task's title: as typed, else the prompt's first line (shortened).
export function newTaskTitle(form) {
  const typed = form.title.value.trim();
  if (typed) return typed;
  const line = form.prompt.value.trim().split("\n")[0].replace(/^\/\S+\s*/, "").trim() || form.prompt.value.trim().split("\n")[0];
  return line.length > 80 ? line.slice(0, 79) + "…" : line;
}

export function newSessionError(error) {
  const box = $("#new-session-error");
  box.hidden = false;
  box.textContent = error.kind ? `${error.kind}: ${error.message}` : error.message;
}

export async function startSession(formNode) {
  const form = formNode.elements;
  $("#new-session-error").hidden = true;
  try {
    let taskId = form.task.value;
    if (!taskId) {
      const title = newTaskTitle(form);
      if (!title) return newSessionError(new Error("Say what the agent should do, or give the task a title."));
      const task = await rpc.call("task.create", { title, description: form.prompt.value || undefined });
      await refreshLists();
      // A retry after a refusal below starts a session of this task, not another task.
      form.task.value = task.id;
      $("#new-title").hidden = true;
      taskId = task.id;
    }
    const session = await rpc.call("task.session.create", {
      task_id: taskId,
      agent_profile_id: form.agent.value,
      workspace_path: form.workspace.value.trim() || undefined,
      prompt: form.prompt.value || undefined,
      runtime: form.runtime.value || undefined,
      // Unchecked leaves it to the profile (a [workspace] section makes worktrees).
      worktree: form.worktree.checked || undefined,
      shared: form.shared.checked || undefined,
      base: form.base.value || undefined,
      labels: parseLabels(form.labels.value),
    });
    $("#new-session-dialog").close();
    formNode.reset();
    $("#new-title").hidden = false;
    await refreshLists();
    await openSession(session.id);
  } catch (error) {
    newSessionError(error);
  }
  return undefined;
}

export async function act(method, params, confirmText) {
  if (confirmText && !window.confirm(confirmText)) return undefined;
  try {
    showError(null);
    return await rpc.call(method, params);
  } catch (error) {
    showError(error);
    if (state.open) sessionError(error);
    return undefined;
  }
}

export function wire() {
  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("tether-token", $("#token").value);
    $("#token-form").hidden = true;
    $("#token-note").textContent = "";
    rpc.connect();
  });
  wireNewSession();
  // Enter sends (queued while the agent works); Alt+Enter steers the running turn;
  // Shift+Enter (or an input method composing) is a new line.
  $("#prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && event.altKey && !event.isComposing && !$("#steer").hidden) {
      event.preventDefault();
      steer();
    } else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("#prompt-form").requestSubmit();
    }
  });
  $("#steer").addEventListener("click", steer);
  $("#editing-cancel").addEventListener("click", stopEditing);
  document.addEventListener("keydown", onShortcut);
  // Esc cancels the running turn, from anywhere on the page but an editor or a dialog
  // (where it closes what is open).
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.isComposing || $("#cancel").hidden || !state.open) return;
    if (document.querySelector("dialog[open]") || /** @type {Element} */ (event.target).closest?.(".queue-editor, dialog")) return;
    event.preventDefault();
    actOnSession("task.session.cancel");
  });
  $("#prompt-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = $("#prompt").value;
    if (!text.trim()) return;
    // An edited earlier prompt: the conversation is rewound to the turn before it first.
    if (!(await rewindForEdit())) return;
    // Who sends wants to see what comes of it, not the old output they had scrolled to:
    // followed from now, since the turn's output can arrive before the prompt's answer.
    if ($("#transcript").hidden === false) {
      state.stick = true;
      $("#jump").hidden = true;
      stickToBottom();
    }
    const started = await act("task.session.prompt", { session_id: state.open, prompt: text });
    // Not what was typed meanwhile (the turn's state can arrive before this answer).
    if (started && $("#prompt").value === text) $("#prompt").value = "";
  });
  $("#workflow-resume").addEventListener("click", async () => {
    const resumed = await act("workflow.resume", { workflow_id: state.openWorkflow });
    if (resumed) renderWorkflow(resumed);
  });
  $("#workflow-cancel").addEventListener("click", () =>
    act("workflow.cancel", { workflow_id: state.openWorkflow }, "Cancel this workflow? Its running steps stop; it can be resumed."));
  $("#cancel").addEventListener("click", () => actOnSession("task.session.cancel"));
  // Not `actOnSession`: a status read as the queue's head starts could land after the
  // events that followed it and show the session RUNNING again.
  $("#queue-resume").addEventListener("click", () =>
    act("task.session.queue.resume", { session_id: state.open }));
  $("#pause").addEventListener("click", askPause);
  $("#fork").addEventListener("click", () => fork(null));
  $("#resume").addEventListener("click", () => resume(state.open));
  $("#stop").addEventListener("click", () =>
    actOnSession("task.session.stop", "Stop this session for good? It cannot be resumed."));
  // Back and forward move between the sessions and workflows opened.
  window.addEventListener("hashchange", () => {
    const session = location.hash.match(/^#\/session\/(.+)$/);
    const workflow = location.hash.match(/^#\/workflow\/(.+)$/);
    if (session && session[1] !== state.open) openSession(session[1]);
    else if (workflow && workflow[1] !== state.openWorkflow) openWorkflow(workflow[1]);
  });
  $("#delete").addEventListener("click", async () => {
    const done = await act("task.session.delete", { session_id: state.open }, "Delete this session and its records?");
    if (done) {
      state.open = null;
      $("#session").hidden = true;
      location.hash = "";
      await refreshLists();
    }
  });
  // The transcript follows new output until the reader scrolls up; back at the end (or
  // with "new output ↓") it follows again.
  $("#transcript").addEventListener("scroll", () => {
    const box = $("#transcript");
    state.stick = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    if (state.stick) $("#jump").hidden = true;
    if (box.scrollTop < 40 && box.querySelector("button.earlier")) loadEarlier();
  });
  $("#jump").addEventListener("click", () => {
    state.stick = true;
    $("#jump").hidden = true;
    stickToBottom();
  });
  wireList();
  wireViews();
}

// ---- connection state ------------------------------------------------------------------

export async function onConnected() {
  // Errors from before the reconnect are gone; the open session's status says again what
  // is wrong now.
  $("#session-error").hidden = true;
  const badge = $("#connection");
  badge.textContent = "connected";
  badge.className = "badge online";
  $("#app").hidden = false;
  showError(null);
  state.listFollowed = false;
  state.workflowsFollowed = false;
  try {
    await refreshLists();
    const workflow = location.hash.match(/^#\/workflow\/(.+)$/);
    if (state.openWorkflow) {
      renderWorkflow(await rpc.call("workflow.status", { workflow_id: state.openWorkflow }));
    } else if (workflow) {
      await openWorkflow(workflow[1]);
    }
    const match = location.hash.match(/^#\/session\/(.+)$/);
    if (state.open && !state.live) {
      // Its window never came (the connection dropped first): open it again.
      await openSession(state.open);
    } else if (state.open) {
      // A reconnect: go on after the last event rendered.
      const status = await rpc.call("task.session.status", { session_id: state.open });
      renderStatus(status);
      await follow(state.open);
    } else if (match) {
      await openSession(match[1]);
    }
  } catch (error) {
    showError(error);
  }
}

export function onDisconnected() {
  // The connection's subscriptions went with it.
  state.following = null;
  const badge = $("#connection");
  badge.textContent = "reconnecting…";
  badge.className = "badge offline";
}

// The page's insides, for the browser's console and the browser tests (a module's names
// are not globals).
window.tether = { state, render, markdown, diffView, openSession, act, showError, sessionError, renderLists, changes: Changes };

wire();
export const tokenRequired = $('meta[name="tether-token-required"]').content === "true";
if (tokenRequired && !sessionStorage.getItem("tether-token")) {
  $("#token-form").hidden = false;
} else {
  rpc.connect();
}
