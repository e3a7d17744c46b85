// @ts-check
// The Changes tab: a review of everything the open session's workspace changed since its
// base commit (task.session.changes) — each file with its diff side by side, Keep and
// Revert per file, and line comments gathered into one prompt to the agent (queued while
// it works) — and a workflow's review (each step's session's changes). Live: read again after each tool call completes and each turn ends. Files
// are updated in place (render.js `reconcile`), keyed by path and content, so focus and
// scroll survive a reading.
// Its pure parts are in diff.js.
import { openSession, rpc, showError } from "./app.js";
import { reconcile } from "./lists.js";
import { $, el } from "./render.js";
import { state } from "./state.js";
import { showTab } from "./views.js";
import { parseHunks, sideBySide, totals, commentsPrompt } from "./diff.js";

/** The most rows of one file's diff drawn. */
const ROWS = 2000;

const review = {
  session: null, // the session reviewed
  reading: false, // a read is in flight
  again: false, // something changed while it was: read once more
  stale: true, // the tab was hidden when something changed
  open: new Set(), // paths expanded by the reviewer (kept files start folded)
  folded: new Set(), // paths folded by the reviewer
  comments: [],
  draft: null, // the comment being written: { path, side, line, quote }
  last: null, // the changes read last, drawn again when only the page's side changed
};

const storageKey = () => `tether-review:${review.session}`;

function loadComments() {
  try {
    review.comments = JSON.parse(localStorage.getItem(storageKey()) || "[]");
  } catch {
    review.comments = [];
  }
}

function saveComments() {
  if (review.comments.length) localStorage.setItem(storageKey(), JSON.stringify(review.comments));
  else localStorage.removeItem(storageKey());
}

/** A session was opened: its review starts over (its comments come back from storage). */
export function reset(sessionId) {
  review.session = sessionId;
  $("#changes-files").keyed = null;
  review.open.clear();
  review.folded.clear();
  review.draft = null;
  review.last = null;
  review.stale = true;
  loadComments();
  $("#changes-files").replaceChildren();
  $("#changes-summary").textContent = "";
  renderComments();
  read();
}

const visible = () => !$("#changes").hidden;

/** The tab was shown: what was read while it was hidden is drawn now. */
export function show() {
  if (review.stale) read();
  else redraw();
}

/** A live event of the open session: the workspace may have changed. */
export function onEvent(event) {
  const done = event.type === "turn_ended" || event.type === "rewound" || event.type === "change_reviewed"
    || (event.type === "tool_call_update" && event.update && event.update.status === "completed");
  if (!done) return;
  if (visible()) read();
  else review.stale = true;
}

async function read() {
  if (review.reading) {
    review.again = true;
    return;
  }
  const session = review.session;
  review.reading = true;
  review.stale = false;
  try {
    const changes = await rpc.call("task.session.changes", { session_id: session });
    if (session === review.session) draw(changes);
  } catch (error) {
    if (session === review.session) $("#changes-summary").textContent = `The changes cannot be read: ${error.message}`;
  } finally {
    review.reading = false;
    // Asked again meanwhile (by this session's events, or by another session opened).
    if (review.again) {
      review.again = false;
      read();
    }
  }
}

function draw(changes) {
  review.last = changes;
  const sum = totals(changes.files);
  const tab = document.querySelector('[data-tab="changes"]');
  tab.textContent = sum.files ? `Changes (${sum.files})` : "Changes";
  const base = changes.base_commit ? changes.base_commit.slice(0, 10) : "";
  $("#changes-summary").textContent = !changes.repository
    ? "The workspace is not in a git repository: Tether reviews changes through git."
    : sum.files === 0
      ? `No changes since the session's base (${base}).`
      : `${sum.files} file${sum.files === 1 ? "" : "s"} changed since ${base} · +${sum.additions} −${sum.deletions}`
        + (sum.kept ? ` · ${sum.kept} kept` : "") + (changes.truncated ? " · more not listed" : "")
        + (changes.error ? ` · ${changes.error}` : "");
  // Hidden, only the counts are kept up to date: the files are drawn when it is shown.
  if (visible()) drawFiles(changes.files, changes.base_commit);
}

/** A file's section is drawn again only when what it shows changed. */
function drawFiles(files, base) {
  const shown = (file) => ({
    comments: review.comments.filter((c) => c.path === file.path),
    expanded: review.open.has(file.path) || (!file.kept && !review.folded.has(file.path)),
    draft: review.draft && review.draft.path === file.path ? review.draft : null,
  });
  reconcile($("#changes-files"), files, (file) => file.path,
    (file) => JSON.stringify([base, file.content, file.kept, file.omitted || "", shown(file)]),
    (file) => {
      const { expanded, comments } = shown(file);
      return fileSection(file, expanded, comments);
    });
}

function fileSection(file, expanded, comments) {
  const toggle = el("button", { class: "quiet fold", "aria-expanded": String(expanded),
    "aria-label": `${expanded ? "fold" : "unfold"} ${file.path}`,
    onclick: () => fold(file.path, expanded) }, expanded ? "▾" : "▸");
  const counts = file.additions === undefined ? "binary" : `+${file.additions} −${file.deletions}`;
  const head = el("div", { class: "change-head" }, toggle,
    el("span", { class: "path" }, file.path),
    el("span", { class: `badge change-${file.kind}` }, file.kind),
    el("span", { class: "muted" }, counts),
    file.kept ? el("span", { class: "badge kept" }, "kept") : "",
    comments.length ? el("span", { class: "muted" }, `${comments.length} comment${comments.length === 1 ? "" : "s"}`) : "",
    el("span", { class: "grow" }),
    el("button", { "aria-label": `${file.kept ? "unkeep" : "keep"} ${file.path}`, onclick: () => keep(file) },
      file.kept ? "Unkeep" : "Keep"),
    el("button", { class: "danger", "aria-label": `revert ${file.path}`, onclick: (e) => askRevert(file, e.target) }, "Revert"));
  const body = expanded ? diffTable(file, comments) : "";
  return el("section", { class: `change${file.kept ? " kept" : ""}`, "data-path": file.path }, head, body);
}

function fold(path, expanded) {
  if (expanded) {
    review.open.delete(path);
    review.folded.add(path);
  } else {
    review.folded.delete(path);
    review.open.add(path);
  }
  redraw();
}

function diffTable(file, comments) {
  if (!file.diff) return el("p", { class: "muted" }, file.omitted || "no diff");
  const rows = sideBySide(parseHunks(file.diff));
  const drawn = [];
  for (const row of rows.slice(0, ROWS)) {
    if ("gap" in row) {
      drawn.push(el("tr", { class: "hunk" }, el("td", { colspan: 4 }, row.gap)));
      continue;
    }
    drawn.push(el("tr", {}, ...cells(file, row.left, "old", comments), ...cells(file, row.right, "new", comments)));
    for (const which of [row.left && { ...row.left, side: "old" }, row.right && { ...row.right, side: "new" }]) {
      if (!which) continue;
      for (const c of comments.filter((c) => c.side === which.side && c.line === which.n)) drawn.push(commentRow(c));
      const draft = review.draft;
      if (draft && draft.path === file.path && draft.side === which.side && draft.line === which.n) drawn.push(draftRow());
    }
  }
  if (rows.length > ROWS) drawn.push(el("tr", {}, el("td", { colspan: 4, class: "muted" }, `… ${rows.length - ROWS} more rows`)));
  return el("div", { class: "diff review" }, el("div", { class: "diff-scroll" },
    el("table", {}, el("colgroup", {}, el("col", { class: "ln" }), el("col", {}), el("col", { class: "ln" }), el("col", {})),
      el("thead", {}, el("tr", {}, el("th", { colspan: 2 }, "base"), el("th", { colspan: 2 }, "now"))),
      el("tbody", {}, ...drawn))));
}

function cells(file, line, side, comments) {
  if (!line) return [el("td", { class: "ln" }), el("td", { class: "code empty" })];
  const noted = comments.some((c) => c.side === side && c.line === line.n);
  const number = el("button", { class: `ln-comment${noted ? " noted" : ""}`,
    "aria-label": `comment on ${file.path} line ${line.n}${side === "old" ? " before" : ""}`,
    title: "Comment on this line", onclick: () => startComment(file.path, side, line) }, String(line.n));
  return [el("td", { class: "ln" }, number), el("td", { class: `code ${line.kind}` }, line.text)];
}

function commentRow(comment) {
  const index = review.comments.indexOf(comment);
  return el("tr", { class: "comment" }, el("td", { colspan: 4 },
    el("span", { class: "comment-text" }, comment.text),
    el("button", { class: "quiet", "aria-label": `remove comment on ${comment.path} line ${comment.line}`,
      onclick: () => removeComment(index) }, "Remove")));
}

function draftRow() {
  const text = el("textarea", { "aria-label": "comment", placeholder: "Comment for the agent (Ctrl+Enter adds it)" });
  text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) addComment(text.value);
    if (event.key === "Escape") {
      event.stopPropagation();
      cancelDraft();
    }
  });
  queueMicrotask(() => text.focus());
  return el("tr", { class: "comment draft" }, el("td", { colspan: 4 }, text,
    el("div", { class: "actions" },
      el("button", { onclick: () => addComment(text.value) }, "Add comment"),
      el("button", { class: "quiet", onclick: cancelDraft }, "Cancel"))));
}

function startComment(path, side, line) {
  review.draft = { path, side, line: line.n, quote: line.text };
  redraw();
}

function cancelDraft() {
  review.draft = null;
  redraw();
}

function addComment(text) {
  const draft = review.draft;
  if (!draft || !text.trim()) return;
  review.comments.push({ path: draft.path, side: draft.side, line: draft.line, quote: draft.quote, text: text.trim() });
  review.draft = null;
  saveComments();
  renderComments();
  redraw();
}

function removeComment(index) {
  review.comments.splice(index, 1);
  saveComments();
  renderComments();
  redraw();
}

/** Draws again what was read last: only the page's side changed (a fold, a comment). */
function redraw() {
  if (review.last) draw(review.last);
}

function renderComments() {
  const count = review.comments.length;
  $("#review-comments").hidden = count === 0;
  $("#review-count").textContent = `${count} comment${count === 1 ? "" : "s"} for the agent`;
}

async function sendComments() {
  if (!review.comments.length) return;
  const session = review.session;
  const prompt = commentsPrompt(review.comments);
  try {
    const started = await rpc.call("task.session.prompt", { session_id: session, prompt });
    if (session !== review.session) return;
    review.comments = [];
    saveComments();
    renderComments();
    redraw();
    $("#review-sent").textContent = started.queued
      ? `Sent: queued at position ${started.position}, it runs when the agent is free.`
      : "Sent to the agent.";
  } catch (error) {
    showError(error);
  }
}

function discardComments() {
  review.comments = [];
  saveComments();
  renderComments();
  redraw();
}

async function keep(file) {
  try {
    const changes = await rpc.call("task.session.changes.keep",
      { session_id: review.session, path: file.path, content: file.content, kept: !file.kept });
    review.open.delete(file.path);
    review.folded.delete(file.path);
    draw(changes);
  } catch (error) {
    showError(error);
    read();
  }
}

/** Revert asks first, in place: what the file holds now is saved on a ref. */
function askRevert(file, button) {
  const ask = el("span", { class: "confirm", role: "group", "aria-label": `revert ${file.path}?` },
    `Revert ${file.path} to the base? What it holds now is saved on a ref first; the agent is told with its next prompt. `,
    el("button", { class: "danger", onclick: () => revert(file) }, "Revert file"),
    el("button", { class: "quiet", onclick: () => { ask.remove(); button.hidden = false; button.focus(); } }, "Keep it"));
  button.hidden = true;
  button.after(ask);
  ask.querySelector("button").focus();
}

async function revert(file) {
  try {
    const reverted = await rpc.call("task.session.changes.revert", { session_id: review.session, path: file.path });
    // (The activity line comes with the session's `change_reviewed` event.)
    draw(reverted.changes);
  } catch (error) {
    showError(error);
    read();
  }
}

$("#review-send").addEventListener("click", sendComments);
$("#review-discard").addEventListener("click", discardComments);
$("#changes-refresh").addEventListener("click", () => read());

// ---- a workflow's review ---------------------------------------------------------------

/** A workflow's changes: each step's session's, with a way into that session's review. */
async function workflowReview(status) {
  const holder = $("#workflow-review");
  holder.hidden = false;
  holder.replaceChildren(el("p", { class: "muted" }, "reading each step's changes…"));
  const parts = [];
  for (const step of status.steps.filter((s) => s.session_id)) {
    try {
      const changes = await rpc.call("task.session.changes", { session_id: step.session_id });
      parts.push(stepReview(step, changes));
    } catch (error) {
      parts.push(el("li", { "data-review-step": step.id }, `${step.id}: the changes cannot be read: ${error.message}`));
    }
  }
  if (state.openWorkflow !== status.workflow_id) return;
  holder.replaceChildren(parts.length
    ? el("ul", { class: "step-review", "aria-label": "each step's changes" }, ...parts)
    : el("p", { class: "muted" }, "No step has started a session yet."));
}

function stepReview(step, changes) {
  const sum = totals(changes.files);
  const said = !changes.repository ? "not in a git repository"
    : sum.files === 0 ? "no changes"
      : `${sum.files} file${sum.files === 1 ? "" : "s"} changed · +${sum.additions} −${sum.deletions}${sum.kept ? ` · ${sum.kept} kept` : ""}`;
  const review = el("button", { "aria-label": `review ${step.id}'s changes`, onclick: () => {
    openSession(step.session_id);
    showTab("changes");
  } }, "Review");
  const files = changes.files.map((file) => el("li", {},
    el("span", { class: "path" }, file.path), " ",
    el("span", { class: `badge change-${file.kind}` }, file.kind), " ",
    el("span", { class: "muted" }, file.additions === undefined ? "binary" : `+${file.additions} −${file.deletions}`),
    file.kept ? el("span", { class: "badge kept" }, "kept") : ""));
  return el("li", { "data-review-step": step.id },
    el("div", { class: "step-head" }, el("span", { class: "step-id" }, step.id), el("span", { class: "muted" }, said), review),
    files.length ? el("ul", { class: "review-files" }, ...files) : "");
}

$("#workflow-changes").addEventListener("click", async () => {
  const workflowId = state.openWorkflow;
  try {
    await workflowReview(await rpc.call("workflow.status", { workflow_id: workflowId }));
  } catch (error) {
    showError(error);
  }
});

// A session opened before this module ran (modules run after the classic scripts).
if (state.open) reset(state.open);
