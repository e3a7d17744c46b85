// @ts-check
// The session list: every session newest first, searched, filtered by state, agent and
// task, shown 50 at a time; kept current through one `sessions.subscribe` for the whole
// list; and the "needs you" signal — in the list, the tab's title and a browser
// notification — for a session whose agent asks a question, or whose turn ended unseen.
import { openSession, openWorkflow, rpc, sessionError, showActions, showError, workflowNeedsYou } from "./app.js";
import { matchesList, needsYou, reconcile } from "./lists.js";
import { $, el } from "./render.js";
import { state } from "./state.js";

export const PAGE_SIZE = 50;

export function ago(ms) {
  const seconds = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return new Date(ms).toLocaleDateString();
}

// The list drawn again at the next frame (at once in a hidden tab, where frames wait):
// changes that come together — sessions made or changed in a burst while another streams —
// cost one reduction of the list, not one each.
let listsQueued = false;
export function scheduleLists() {
  if (listsQueued) return;
  listsQueued = true;
  const run = () => {
    listsQueued = false;
    renderLists();
  };
  if (document.hidden) setTimeout(run, 0);
  else requestAnimationFrame(run);
}

export function renderLists() {
  const tasks = new Map(state.tasks.map((t) => [t.id, t]));
  const order = state.list.sort === "oldest" ? 1 : -1;
  const matching = state.sessions
    .filter((s) => matchesList(s, tasks.get(s.task_id), state.list, state.unseen))
    .sort((a, b) => order * (a.created_at - b.created_at || a.id.localeCompare(b.id)));
  const shown = matching.slice(0, state.list.shown);
  // Rows are updated in place: the one a person is on keeps the focus.
  reconcile($("#tasks"), shown, (session) => session.id,
    (session) => JSON.stringify([session, tasks.get(session.task_id)?.title, needsYou(session, state.unseen),
      session.id === state.open, ago(session.created_at)]),
    (session) => sessionRow(session, tasks.get(session.task_id)));
  $("#list-count").textContent = matching.length === state.sessions.length
    ? `${matching.length} session${matching.length === 1 ? "" : "s"}`
    : `${matching.length} of ${state.sessions.length} sessions`;
  $("#more").hidden = shown.length >= matching.length;
  $("#more").textContent = `Show ${Math.min(PAGE_SIZE, matching.length - shown.length)} more`;
  $("#list-empty").hidden = matching.length > 0;
  renderFilters();
  renderForms();
  updateNeedsYou();
}

export function sessionRow(session, task) {
  const flagged = needsYou(session, state.unseen);
  const why = session.awaiting_permission ? "asks for permission" : "turn ended";
  return el("li", {
    class: "session" + (session.id === state.open ? " open" : "") + (flagged ? " needs-you" : ""),
    "data-session": session.id,
    // A list item reached with Tab (Enter opens it), named by what it shows.
    tabindex: "0",
    "aria-current": session.id === state.open ? "true" : null,
    onclick: () => openSession(session.id),
    onkeydown: onRowKey,
  },
  el("span", { class: `badge ${session.state}`, "data-badge": session.id }, session.state),
  el("span", { class: "row-main" },
    el("span", { class: "row-title", title: session.title || (task ? task.title : session.task_id) },
      middleShortened(session.title || (task ? task.title : session.task_id))),
    el("span", { class: "row-meta" }, `${session.agent_profile_id} · ${session.id.slice(-8)} · ${ago(session.created_at)}`)),
  flagged ? el("span", { class: "needs-you-flag", title: why }, "needs you") : "");
}

// A long title keeps its start and its end (where titles alike at their start differ).
export function middleShortened(text) {
  if (text.length <= 56) return text;
  return `${text.slice(0, 34).trimEnd()}…${text.slice(-20).trimStart()}`;
}

// Rows are reached with Tab; Enter or Space opens one, the arrows move between them.
export function onRowKey(event) {
  const row = event.currentTarget;
  if (event.key === "Enter" || event.key === " ") {
    event.preventDefault();
    row.click();
  } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
    event.preventDefault();
    const next = event.key === "ArrowDown" ? row.nextElementSibling : row.previousElementSibling;
    if (next) next.focus();
  }
}

export function renderFilters() {
  const agents = [...new Set(state.sessions.map((s) => s.agent_profile_id))].sort();
  fillSelect($("#filter-agent"), [["", "every agent"], ...agents.map((a) => [a, a])], state.list.agent);
  fillSelect($("#filter-task"), [["", "every task"], ...state.tasks.map((t) => [t.id, t.title])], state.list.task);
}

// A select's options, replaced only when they changed (a select a person has open stays
// open), and its choice.
export function fillSelect(select, options, chosen) {
  const signature = JSON.stringify(options);
  if (select.filledWith !== signature) {
    select.replaceChildren(...options.map(([value, label, disabled]) => el("option", { value, disabled: disabled ? "" : null }, label)));
    select.filledWith = signature;
  }
  if (chosen !== undefined && select.value !== chosen) select.value = chosen;
}

// The new-session dialog's choices: tasks (a new one first), agents, recent workspaces.
export function renderForms() {
  const taskSelect = document.forms["new-session"].elements.task;
  fillSelect(taskSelect, [["", "a new task"], ...state.tasks.map((t) => [t.id, t.title])], taskSelect.value);
  $("#new-title").hidden = taskSelect.value !== "";
  // The workspaces of the newest sessions first (a worktree's own path is not one to reuse).
  const recent = [...new Set([...state.sessions].sort((a, b) => b.created_at - a.created_at)
    .filter((s) => !s.worktree_branch).map((s) => s.workspace_path))].slice(0, 20);
  const datalist = $("#recent-workspaces");
  if (datalist.filledWith !== recent.join("\n")) {
    datalist.replaceChildren(...recent.map((path) => el("option", { value: path })));
    datalist.filledWith = recent.join("\n");
  }
  const agentSelect = document.forms["new-session"].elements.agent;
  fillSelect(agentSelect, state.agents.map((agent) => [agent.id,
    agent.available ? `${agent.display_name || agent.id} (${agent.id})` : `${agent.id} (unavailable)`,
    !agent.available]), agentSelect.value || undefined);
  const reasons = state.agents
    .filter((agent) => !agent.available)
    .map((agent) => `${agent.id}: ${agent.reasons.join("; ")}`);
  $("#agent-reasons").textContent = reasons.join("\n");
  $("#unavailable").hidden = reasons.length === 0;
  $("#unavailable-count").textContent = `${reasons.length} agent${reasons.length === 1 ? "" : "s"} cannot run here — why`;
  $("#welcome").hidden = Boolean(state.open || state.openWorkflow);
}

export function wireList() {
  const refilter = () => {
    state.list.shown = PAGE_SIZE;
    renderLists();
  };
  for (const type of ["input", "change"]) {
    $("#search").addEventListener(type, (event) => {
      if (state.list.query === event.target.value.trim()) return;
      state.list.query = event.target.value.trim();
      refilter();
    });
  }
  for (const [id, key] of [["#filter-state", "state"], ["#filter-agent", "agent"], ["#filter-task", "task"], ["#sort", "sort"]]) {
    $(id).addEventListener("change", (event) => {
      state.list[key] = event.target.value;
      refilter();
    });
  }
  $("#more").addEventListener("click", () => {
    state.list.shown += PAGE_SIZE;
    renderLists();
  });
  $("#notify").addEventListener("click", async () => {
    if (window.Notification) await Notification.requestPermission();
    updateNeedsYou();
  });
  // Back to the tab: the open session's finished turn has been seen.
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && state.open && state.unseen.delete(state.open)) renderLists();
  });
}

export function setBadge(sessionId, sessionState) {
  for (const badge of document.querySelectorAll(`[data-badge="${sessionId}"]`)) {
    badge.textContent = sessionState;
    badge.className = `badge ${sessionState}`;
  }
}

// The list follows every session through one subscription: a session created or changed
// elsewhere shows up with its state, a deleted one goes, and a gap lists everything again.
export async function followList() {
  if (state.listFollowed) return;
  state.listFollowed = true;
  try {
    await rpc.subscribeList(onListEvent);
  } catch (error) {
    state.listFollowed = false;
    showError(error);
  }
}

export async function onListEvent(event) {
  if (event.type === "changed") {
    const session = event.session;
    const index = state.sessions.findIndex((s) => s.id === session.id);
    const before = index >= 0 ? state.sessions[index] : null;
    // A turn that ended while the reader was elsewhere is news for them.
    const looking = state.open === session.id && !document.hidden;
    if (before && before.state === "RUNNING" && session.state === "WAITING_FOR_INPUT" && !looking) {
      state.unseen.add(session.id);
    }
    if (index >= 0) state.sessions[index] = session;
    else state.sessions.push(session);
    if (!state.tasks.some((t) => t.id === session.task_id)) state.tasks = await rpc.call("task.list");
    scheduleLists();
  } else if (event.type === "deleted") {
    state.sessions = state.sessions.filter((s) => s.id !== event.session_id);
    state.unseen.delete(event.session_id);
    scheduleLists();
    if (state.open === event.session_id) {
      sessionError(new Error("this session was deleted"));
      showActions("COMPLETED");
    }
  } else if (event.type === "resync") {
    const [tasks, sessions] = await Promise.all([rpc.call("task.list"), rpc.call("task.session.list", {})]);
    state.tasks = tasks;
    state.sessions = sessions;
    scheduleLists();
  }
}

// The tab's title counts the sessions and workflows that need a person; one that starts
// needing one while the tab is hidden (or while it is not the one open) raises a
// notification, once.
export function updateNeedsYou() {
  const waiting = state.sessions.filter((session) => needsYou(session, state.unseen));
  // The open session's own open questions count too (the list may not have caught up).
  const openAsks = [...state.permissions.values()].some((box) => box.classList.contains("open"));
  const ids = new Set(waiting.map((s) => s.id));
  if (openAsks && state.open) ids.add(state.open);
  // A workflow's key is "workflow:" and its id.
  const workflows = state.workflows.filter(workflowNeedsYou);
  for (const workflow of workflows) ids.add("workflow:" + workflow.workflow_id);
  document.title = ids.size ? `(${ids.size}) needs you · Tether` : "Tether";
  for (const workflow of workflows) {
    const id = "workflow:" + workflow.workflow_id;
    if (state.needsYou.has(id)) continue;
    if ((document.hidden || workflow.workflow_id !== state.openWorkflow) && window.Notification && Notification.permission === "granted") {
      const note = new Notification("Tether: a workflow needs you", {
        body: `${workflow.name}: ${workflow.waiting_approval.join(", ")} waits for approval`,
        tag: "tether-" + id,
      });
      note.onclick = () => {
        window.focus();
        openWorkflow(workflow.workflow_id);
      };
    }
  }
  for (const id of ids) {
    if (state.needsYou.has(id) || id.startsWith("workflow:")) continue;
    const session = state.sessions.find((s) => s.id === id);
    if ((document.hidden || id !== state.open) && window.Notification && Notification.permission === "granted") {
      const what = session && session.awaiting_permission ? "asks for permission" : "waits for your next prompt";
      const note = new Notification("Tether: a session needs you", {
        body: `${session ? session.agent_profile_id : "a session"} ${what}`,
        tag: "tether-" + id,
      });
      note.onclick = () => {
        window.focus();
        openSession(id);
      };
    }
  }
  state.needsYou = ids;
  const button = $("#notify");
  button.hidden = !window.Notification || Notification.permission !== "default";
}
