// @ts-check
// The transcript: everything ACP sends, rendered — the agent's Markdown (through the
// vendored marked, sanitized by the vendored DOMPurify), thoughts (collapsible), plans,
// tool calls with their command, output, locations and diffs (side by side), every
// permission option the agent offers, and its context use and cost.
import * as Turns from "./turns.js";
import { egressLine } from "./sandbox.js";
import { lineEnds, openFence, scanFence, settledCount } from "./stream.js";
import { activity, forkButton, refreshTotals, renderQueue, rpc, sessionError, showActions, showError } from "./app.js";
import { setBadge, updateNeedsYou } from "./list.js";
import { editButton, markRewound, rewindButton } from "./rewind.js";
import { state } from "./state.js";
import { refreshSettings, renderTurnNav } from "./views.js";

/**
 * The first element matching `selector` (the page's own markup: it is there).
 * @type {(selector: string) => any}
 */
export const $ = (selector) => document.querySelector(selector);

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== undefined && child !== null) node.append(child);
  }
  return node;
}

// ---- Markdown ------------------------------------------------------------------------

// Past this size a reply is shown as plain text.
export const MARKDOWN_LIMIT = 200 * 1024;

export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// Raw HTML in an agent's Markdown is shown as the text it is, never as markup.
if (window.marked) {
  window.marked.use({
    gfm: true,
    renderer: {
      html(token) {
        return escapeHtml(token.text || token.raw || "");
      },
    },
  });
}

export function canRenderMarkdown(text) {
  return Boolean(window.marked && window.DOMPurify) && text.length <= MARKDOWN_LIMIT;
}

// Markdown's blocks (marked's tokens), its link definitions from `links` known too.
export function lexMarkdown(text, links = {}) {
  const lexer = new window.marked.Lexer();
  Object.assign(lexer.tokens.links, links);
  return lexer.lex(text);
}

// Blocks as a fragment: rendered, sanitized, links opened outside the page, code blocks
// highlighted.
export function renderBlocks(tokens) {
  const html = window.marked.Parser.parse(tokens);
  const clean = window.DOMPurify.sanitize(html, {
    RETURN_DOM_FRAGMENT: true,
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe", "img"],
    FORBID_ATTR: ["style"],
  });
  for (const link of clean.querySelectorAll("a[href]")) {
    link.setAttribute("target", "_blank");
    link.setAttribute("rel", "noopener noreferrer");
  }
  for (const code of clean.querySelectorAll("pre > code")) highlight(code);
  return clean;
}

// An agent's Markdown as a fragment.
export function markdown(text) {
  const fragment = document.createDocumentFragment();
  if (canRenderMarkdown(text)) fragment.append(renderBlocks(lexMarkdown(text)));
  else fragment.append(el("div", { class: "plain" }, text));
  return fragment;
}

// A small highlighter of our own: comments, strings, numbers and the keywords most
// languages share. It works on the code's text, so it cannot bring markup in.
export const KEYWORDS = new Set(
  ("as async await break case catch class const continue def default do elif else enum export " +
    "extends false fn for from func function if impl import in interface let loop match mod mut " +
    "new nil None null package pub return self Self static struct super switch this throw trait " +
    "true True False try type typeof use var while with yield").split(" "),
);
export const TOKEN = /(\/\/[^\n]*|#[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)|\b(\d[\d_.]*(?:e[+-]?\d+)?)\b|\b([A-Za-z_][A-Za-z0-9_]*)\b/g;

export function highlight(code) {
  const language = (code.className.match(/language-(\S+)/) || [])[1] || "";
  const hashComments = /^(py|python|sh|bash|shell|zsh|toml|yaml|yml|rb|ruby|dockerfile|make)$/.test(language);
  const text = code.textContent;
  const out = document.createDocumentFragment();
  let at = 0;
  for (const match of text.matchAll(TOKEN)) {
    const [whole, comment, string, number, word] = match;
    let kind = null;
    if (comment && (hashComments || !comment.startsWith("#"))) kind = "c";
    else if (string) kind = "s";
    else if (number) kind = "n";
    else if (word && KEYWORDS.has(word)) kind = "k";
    if (!kind) continue;
    out.append(text.slice(at, match.index), el("span", { class: "tok-" + kind }, whole));
    at = match.index + whole.length;
  }
  out.append(text.slice(at));
  code.replaceChildren(out);
  code.parentElement.classList.add("code");
  if (language) code.parentElement.dataset.language = language;
}

// ---- an agent message as it streams ------------------------------------------------

// An agent message takes its text as it streams and is rendered at most once an animation
// frame, for what the frame's chunks added (a hidden tab renders when shown again). Its
// settled Markdown blocks — all but the last, which text to come can still change — are
// rendered once and kept; a frame lexes only the open tail from where they end. A code
// fence still open is all tail: its new text is added to its code as it is, without lexing,
// and it is lexed again once it closes or the message ends (`endAgentText`). So a frame
// costs what its tail holds, not the whole reply (a reply of 152 KB is lexed a few times
// over, not once a chunk), and the message ends rendered as its whole text would be
// (`markdown`).
export function appendAgentText(block, text) {
  block.raw = (block.raw || "") + text;
  if (state.backfill) {
    state.backfillBlocks.add(block); // rendered once the window is in (views.js)
    return;
  }
  const stream = block.stream || (block.stream = newStream());
  // "\r\n" and "\r" are line ends, as marked reads them (a "\r\n" may be cut in two).
  const added = lineEnds(stream.cr, text);
  stream.cr = added.cr;
  stream.text += added.text;
  queueAgentText(block);
}

// What a streamed message keeps between frames.
export function newStream() {
  return {
    text: "", // its text, each line end a "\n"
    cr: false, // the last chunk ended with a "\r" (a "\n" starting the next ends no line)
    settled: 0, // how much of `text` is rendered for good
    links: {}, // the link definitions in the settled text
    defines: false, // a link definition was seen: the message is rendered again at its end
    tail: [], // the nodes that show the open tail
    fence: null, // the open code fence grown without lexing (`growingFence`)
    queued: false, // a frame will render it
    ended: false, // the message is whole
    plain: null, // past MARKDOWN_LIMIT: its text shown as it is, up to `shown`
    shown: 0,
  };
}

// The message streamed into is whole: a new block of the transcript follows it.
export function endAgentMessage() {
  endAgentText(state.currentAgent);
  state.currentAgent = null;
}

// A message is whole (its turn ended, a tool call or a new turn followed): an open fence's
// code, added as text, is rendered properly.
export function endAgentText(block) {
  const stream = block && block.stream;
  if (!stream || stream.ended) return;
  stream.ended = true;
  if ((stream.fence && stream.fence.added) || stream.defines) queueAgentText(block);
}

export function queueAgentText(block) {
  const stream = block.stream;
  if (stream.queued) return;
  stream.queued = true;
  requestAnimationFrame(() => {
    stream.queued = false;
    renderAgentText(block);
    stickToBottom();
  });
}

export function renderAgentText(block) {
  const stream = block.stream;
  if (!canRenderMarkdown(block.raw)) {
    // Too long for Markdown: the text as it is, from here on.
    if (!stream.plain) {
      stream.plain = el("div", { class: "plain" });
      block.replaceChildren(stream.plain);
    }
    stream.plain.append(block.raw.slice(stream.shown));
    stream.shown = block.raw.length;
    return;
  }
  if (stream.fence && !stream.ended && growFence(stream)) return;
  stream.fence = null;
  if (stream.ended && stream.defines) {
    // Link definitions hold for the whole message, above them too: once it is whole, it is
    // rendered again whole, once.
    stream.defines = false;
    stream.settled = 0;
    stream.links = {};
    stream.tail = [];
    block.replaceChildren();
  }
  const tail = stream.text.slice(stream.settled);
  const tokens = lexMarkdown(tail, stream.links);
  if (!stream.ended && tokens.some((token) => token.type === "def")) stream.defines = true;
  // The settled blocks (stream.js) are rendered here, before the tail, for good.
  const last = settledCount(tokens);
  const settled = tokens.slice(0, last);
  const settledText = settled.map((token) => token.raw).join("");
  let open = tokens;
  if (settled.length && tail.startsWith(settledText)) {
    const fragment = renderBlocks(settled);
    if (stream.tail.length) stream.tail[0].before(fragment);
    else block.append(fragment);
    stream.settled += settledText.length;
    // A settled definition is whole: the tail is lexed knowing it.
    for (const token of settled) {
      if (token.type === "def" && !(token.tag in stream.links)) stream.links[token.tag] = { href: token.href, title: token.title };
    }
    open = tokens.slice(last);
  }
  const fragment = renderBlocks(open);
  const nodes = [...fragment.childNodes];
  for (const node of stream.tail) node.remove();
  block.append(fragment);
  stream.tail = nodes;
  if (!stream.ended) stream.fence = growingFence(stream, open[open.length - 1], nodes);
}

// The tail's last block when it is a code fence not closed yet, its opening line whole and
// not indented: where its code is shown and what closes it; else null.
export function growingFence(stream, token, nodes) {
  if (!token || token.type !== "code" || !stream.text.endsWith(token.raw)) return null;
  const fence = openFence(token.raw);
  if (!fence) return null;
  const { closing, code } = fence;
  const lines = code.split("\n");
  const pre = nodes.filter((node) => node.nodeName === "PRE").pop();
  const element = pre && pre.firstElementChild;
  // marked shows the code with a line end after its last line.
  const shown = code === "" || code.endsWith("\n") ? code : code + "\n";
  if (!element || element.nodeName !== "CODE" || element.textContent !== shown) return null;
  // What is added goes before that line end, held in a node of its own.
  let end = element.lastChild;
  if (shown !== code) {
    if (!end || end.nodeType !== Node.TEXT_NODE || !end.data.endsWith("\n")) return null;
    end = end.splitText(end.data.length - 1);
  } else {
    element.append((end = document.createTextNode("")));
  }
  return { closing, element, end, shownTo: stream.text.length, scanFrom: stream.text.length - lines[lines.length - 1].length, added: false };
}

// Adds the text since the last frame to an open fence's code; false when a line of it
// closes the fence (the tail is lexed again).
export function growFence(stream) {
  const fence = stream.fence;
  const text = stream.text;
  const scanned = scanFence(text, fence.scanFrom, fence.closing);
  if (scanned.closed) return false;
  fence.scanFrom = scanned.scanFrom;
  fence.element.insertBefore(document.createTextNode(text.slice(fence.shownTo)), fence.end);
  fence.shownTo = text.length;
  fence.end.data = text.endsWith("\n") ? "" : "\n";
  fence.added = true;
  return true;
}

// ---- diffs ---------------------------------------------------------------------------

// Line operations turning `a` into `b`: common prefix and suffix, then a longest common
// subsequence of what is between (or, past a size, all of it removed and added).
export function lineDiff(a, b) {
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA--;
    endB--;
  }
  const ops = [];
  for (let i = 0; i < start; i++) ops.push({ op: "=", a: i, b: i });
  const n = endA - start;
  const m = endB - start;
  if (n * m > 4_000_000) {
    for (let i = start; i < endA; i++) ops.push({ op: "-", a: i });
    for (let j = start; j < endB; j++) ops.push({ op: "+", b: j });
  } else {
    // at(i, j): the LCS of a[start+i..endA] and b[start+j..endB], in one flat table.
    const width = m + 1;
    const lengths = new Uint32Array((n + 1) * width);
    const at = (i, j) => lengths[i * width + j];
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        lengths[i * width + j] = a[start + i] === b[start + j]
          ? at(i + 1, j + 1) + 1
          : Math.max(at(i + 1, j), at(i, j + 1));
      }
    }
    let i = 0;
    let j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && a[start + i] === b[start + j]) {
        ops.push({ op: "=", a: start + i++, b: start + j++ });
      } else if (j < m && (i === n || at(i, j + 1) >= at(i + 1, j))) {
        ops.push({ op: "+", b: start + j++ });
      } else {
        ops.push({ op: "-", a: start + i++ });
      }
    }
  }
  for (let k = 0; k < a.length - endA; k++) ops.push({ op: "=", a: endA + k, b: endB + k });
  return ops;
}

// The most rows of a diff shown.
export const DIFF_ROWS = 2000;

// ACP `diff` content side by side: the old text left, the new right, removed and added
// lines paired up.
export function diffView(item) {
  const lines = (text) => (text ? text.replace(/\n$/, "").split("\n") : []);
  const oldLines = lines(item.oldText);
  const newLines = lines(item.newText);
  const ops = lineDiff(oldLines, newLines);
  const rows = [];
  const cell = (number, text, kind) => [
    el("td", { class: "ln" }, number === undefined ? "" : String(number + 1)),
    el("td", { class: "code " + kind }, text === undefined ? "" : text),
  ];
  let removed = [];
  let added = [];
  const flush = () => {
    for (let k = 0; k < Math.max(removed.length, added.length); k++) {
      const left = removed[k];
      const right = added[k];
      rows.push(el("tr", {},
        ...cell(left, left === undefined ? undefined : oldLines[left], left === undefined ? "empty" : "del"),
        ...cell(right, right === undefined ? undefined : newLines[right], right === undefined ? "empty" : "ins")));
    }
    removed = [];
    added = [];
  };
  for (const op of ops) {
    if (op.op === "-") removed.push(op.a);
    else if (op.op === "+") added.push(op.b);
    else {
      flush();
      rows.push(el("tr", {}, ...cell(op.a, oldLines[op.a], "ctx"), ...cell(op.b, newLines[op.b], "ctx")));
    }
  }
  flush();
  const removedCount = ops.filter((o) => o.op === "-").length;
  const addedCount = ops.filter((o) => o.op === "+").length;
  const counts = removedCount || addedCount || item.oldText === item.newText
    ? `−${removedCount} +${addedCount}`
    : "the line endings changed";
  // A big file's diff shows its first rows; the rest is counted.
  const hidden = rows.length - DIFF_ROWS;
  if (hidden > 0) {
    rows.length = DIFF_ROWS;
    rows.push(el("tr", {}, el("td", { colspan: 4, class: "muted" }, `… ${hidden} more lines`)));
  }
  return el("div", { class: "diff", "data-diff": item.path || "" },
    el("div", { class: "diff-head" }, el("span", { class: "path" }, item.path || "(a file)"),
      item.oldText ? "" : el("span", { class: "badge" }, "new file"), el("span", { class: "muted" }, counts)),
    el("div", { class: "diff-scroll" },
      el("table", {}, el("colgroup", {}, el("col", { class: "ln" }), el("col", {}), el("col", { class: "ln" }), el("col", {})),
        el("thead", {}, el("tr", {}, el("th", { colspan: 2 }, "before"), el("th", { colspan: 2 }, "after"))),
        el("tbody", {}, ...rows))));
}

// ---- tool calls ----------------------------------------------------------------------

// A tool call's block: created by `tool_call`, merged with each `tool_call_update` (ACP
// sends only what changed; content and locations, when sent, replace what was there).
export function renderTool(update) {
  const id = update.toolCallId;
  let tool = state.tools.get(id);
  if (!tool) {
    endAgentMessage();
    tool = { fields: {}, node: null };
    state.tools.set(id, tool);
  }
  for (const [key, value] of Object.entries(update)) {
    if (value === undefined || value === null || key === "sessionUpdate") continue;
    // An earlier window's update is older than what is shown: it only fills gaps.
    if (state.backfill && key in tool.fields) continue;
    tool.fields[key] = value;
  }
  const f = tool.fields;
  const status = f.status || "pending";
  const parts = [];
  const command = f.rawInput && (f.rawInput.command || f.rawInput.cmd);
  if (command) parts.push(el("pre", { class: "command" }, "$ " + (Array.isArray(command) ? command.join(" ") : command)));
  if (Array.isArray(f.locations) && f.locations.length) {
    parts.push(el("ul", { class: "locations" },
      ...f.locations.map((loc) => el("li", {}, loc.line ? `${loc.path}:${loc.line}` : loc.path))));
  }
  for (const item of Array.isArray(f.content) ? f.content : []) {
    if (item.type === "diff") parts.push(diffView(item));
    else if (item.type === "terminal") parts.push(el("div", { class: "muted" }, `terminal ${item.terminalId}`));
    else if (item.type === "content" && item.content && item.content.type === "text") {
      parts.push(el("pre", { class: "output" + (status === "failed" ? " failed" : "") }, item.content.text));
    }
  }
  if (!parts.some((p) => p.classList.contains("output")) && typeof f.rawOutput === "string") {
    parts.push(el("pre", { class: "output" + (status === "failed" ? " failed" : "") }, f.rawOutput));
  }
  const summary = el("summary", {},
    el("span", { class: "kind" }, f.kind || "tool"),
    ` ${f.title || "tool"} — `,
    el("span", { class: `status ${status}` }, status));
  const node = el("details", { class: `tool ${status}`, "data-tool": id }, summary, ...parts);
  // Open while it runs, when it failed, and when it changed files; folded otherwise.
  if (status === "failed" || status === "in_progress" || parts.some((p) => p.classList.contains("diff"))) node.open = true;
  if (tool.node) {
    if (tool.node.dataset.touched) node.open = tool.node.open;
    node.dataset.touched = tool.node.dataset.touched || "";
    tool.node.replaceWith(node);
  } else {
    transcript(node);
  }
  summary.addEventListener("click", () => { node.dataset.touched = "1"; });
  tool.node = node;
}

// ---- plans, usage --------------------------------------------------------------------

// What the transcript and the snapshot view say for Tether's summary prompt at a pause.
export const SUMMARY_ASKED = "Tether asked the agent for its summary before pausing";

export const PLAN_MARKS = { completed: "✓", in_progress: "▶", pending: "○" };

// ACP sends the whole plan each time: the turn's plan box shows the latest.
export function renderPlan(entries) {
  const node = el("div", { class: "plan", "aria-label": "the agent's plan" },
    el("div", { class: "plan-head" }, "Plan"),
    el("ol", {}, ...entries.map((entry) =>
      el("li", { class: `plan-entry ${entry.status}`, "data-status": entry.status },
        el("span", { class: "mark", "aria-hidden": "true" }, PLAN_MARKS[entry.status] || "○"),
        " ", entry.content,
        entry.priority === "high" ? el("span", { class: "badge" }, "high") : ""))));
  if (state.plan && state.plan.parentNode) state.plan.replaceWith(node);
  else transcript(node);
  state.plan = node;
}

export function formatTokens(n) {
  return n >= 1000 ? `${(n / 1000).toFixed(n >= 100000 ? 0 : 1)}k` : String(n);
}

// The agent's context use (ACP `usage_update`) and cost, in the session's head.
export function renderUsage(update) {
  if (typeof update.used !== "number" || typeof update.size !== "number" || update.size <= 0) return;
  const meter = $("#context-meter");
  meter.max = update.size;
  meter.value = update.used;
  const percent = Math.round((update.used / update.size) * 100);
  const cost = update.cost && typeof update.cost.amount === "number"
    ? ` · ${update.cost.amount.toFixed(2)} ${update.cost.currency || ""}`.trimEnd()
    : "";
  $("#usage-text").textContent = `context ${formatTokens(update.used)} / ${formatTokens(update.size)} (${percent}%)${cost}`;
  $("#usage").hidden = false;
  $("#usage").classList.toggle("high", percent >= 80);
}

// The session's totals (tokens and cost of its turns) and its budgets, from its status.
export function renderTotals(usage) {
  const box = $("#totals");
  // Unknown is not zero: turns ended and none of them reported tokens.
  const unknown = usage && usage.turns_with_tokens === 0 && usage.turns_without_tokens > 0;
  const tokens = unknown ? ["tokens not reported"]
    : usage && usage.total_tokens ? [`${formatTokens(usage.total_tokens)} tokens`] : [];
  const cost = ((usage && usage.cost) || []).map((c) => `${c.amount.toFixed(2)} ${c.currency}`);
  // A token limit over turns that reported no tokens cannot be checked: said, not 0 %.
  const unchecked = (b) => b.budget.tokens != null && b.turns_with_tokens === 0 && b.turns_without_tokens > 0;
  const budgets = ((usage && usage.budgets) || []).map((b) => unchecked(b)
    ? `${b.scope} budget ${b.budget.cost != null ? b.percent + "%, " : ""}tokens unchecked`
    : `${b.scope} budget ${b.percent}%`);
  // Only what the agent reported (many report no tokens, some no cost).
  if (!tokens.length && !cost.length && !budgets.length) { box.hidden = true; return; }
  box.textContent = [...tokens, ...cost, ...budgets].join(" · ");
  box.title = unknown ? `${usage.turns} turns: the agent reported no tokens` :
    `${usage.turns} turns: ${usage.input_tokens} in, ${usage.output_tokens} out, ` +
    `${usage.cached_read_tokens + usage.cached_write_tokens} cached, ${usage.thought_tokens} thinking` +
    (usage.turns_without_tokens ? ` (${usage.turns_without_tokens} turns without a token report)` : "");
  box.classList.toggle("high", (usage.budgets || []).some((b) => b.percent >= 80));
  box.hidden = false;
}

// ---- the transcript ------------------------------------------------------------------

// "working…" beside the state while a turn runs.
export function showWorking(sessionState) {
  $("#working").hidden = sessionState !== "RUNNING";
}

// Whether the transcript follows new output: it does until the reader scrolls up, and
// again once they scroll back to the end (or press "new output ↓").
export function stickToBottom() {
  const box = $("#transcript");
  if (state.stick) box.scrollTop = box.scrollHeight;
  else $("#jump").hidden = false;
}

// The newest prompt of the live transcript stays in view over its turn's output (CSS:
// `.current` is sticky); an earlier window's prompts are not the newest.
export function markCurrent(node) {
  if (state.backfill) return;
  for (const old of $("#transcript").querySelectorAll(":scope > .current")) old.classList.remove("current");
  node.classList.add("current");
}

// Appends to the transcript — or, while an earlier window is rendered, to its holder.
export function transcript(node) {
  // The turn it belongs to, so a rewind can mark it (rewind.js).
  const turn = state.backfill ? state.backfillTurn : state.liveTurn;
  if (turn && node.dataset) node.dataset.inTurn = turn;
  if (state.backfill) {
    state.backfill.append(node);
    return node;
  }
  $("#transcript").append(node);
  stickToBottom();
  return node;
}

export function render(event) {
  if (!state.backfill && !goesOnWithStep(event)) stepEnded(event.at);
  switch (event.type) {
    case "state": {
      if (state.backfill) break; // an earlier window's states are history
      const badge = $("#session-state");
      // A turn of the open session that ends while the tab is hidden is news too.
      if (state.live && document.hidden && badge.textContent === "RUNNING" && event.state === "WAITING_FOR_INPUT") {
        state.unseen.add(state.open);
      }
      // An error an action left is about the state it met: the state moved on, so it goes.
      const moved = badge.textContent !== event.state;
      if (moved) showError(null);
      badge.textContent = event.state;
      badge.className = `badge ${event.state}`;
      showWorking(event.state);
      // The agent's session opened (a start, a resume): its settings are known now.
      if (event.state === "WAITING_FOR_INPUT" && badge.dataset.was !== "RUNNING") refreshSettings();
      badge.dataset.was = event.state;
      showActions(event.state, event.state === "WAITING_FOR_INPUT" && Boolean(event.error));
      setBadge(state.open, event.state);
      if (event.error) sessionError(new Error(event.error));
      else if (moved) $("#session-error").hidden = true;
      break;
    }
    case "turn_started":
      endAgentMessage();
      state.currentThought = null;
      state.plan = null;
      if (state.backfill) state.backfillTurn = event.turn_id;
      else {
        state.liveTurn = event.turn_id;
        const known = state.turns.length;
        state.turns = Turns.withStarted(state.turns, event);
        if (state.turns.length !== known) renderTurnNav();
      }
      // Tether's own prompt (the summary asked for at a pause) is not the person's.
      markCurrent(transcript(event.origin === "pause_summary"
        ? el("details", { class: "user tether-ask", "data-turn": event.turn_id },
          el("summary", {}, SUMMARY_ASKED), el("div", { class: "tether-ask-text" }, event.prompt))
        : el("div", { class: "user", "data-turn": event.turn_id },
          (event.steer_of ? "You (steering): " : "You: ") + event.prompt,
          editButton(event.turn_id, event.prompt))));
      break;
    case "steered":
      // Into the turn: the person's message within it. Else the turn is being cancelled
      // and the message runs next (its turn shows it).
      endAgentMessage();
      transcript(event.mode === "native"
        ? el("div", { class: "user steer", "data-steer": event.turn_id }, "You (steering): " + event.prompt)
        : el("div", { class: "notice steer" },
          "steering: this agent cannot take a message mid-turn, so the turn is cancelled and your message runs next"));
      break;
    case "agent_message_chunk":
      state.currentThought = null;
      if (!state.currentAgent) state.currentAgent = transcript(el("div", { class: "agent markdown" }));
      appendAgentText(state.currentAgent, event.text);
      break;
    case "agent_thought_chunk":
      if (!state.currentThought) {
        const body = el("div", { class: "thought-text" });
        transcript(el("details", { class: "thought" }, el("summary", {}, "Thinking"), body));
        state.currentThought = body;
      }
      state.currentThought.append(event.text);
      break;
    case "tool_call":
    case "tool_call_update":
      renderTool(event.update);
      break;
    case "session_update": {
      const kind = event.update && event.update.sessionUpdate;
      if (kind === "plan" && Array.isArray(event.update.entries)) renderPlan(event.update.entries);
      else if (kind === "usage_update" && !state.backfill) renderUsage(event.update);
      else if ((kind === "config_option_update" || kind === "current_mode_update") && !state.backfill) refreshSettings();
      break;
    }
    case "permission_request":
      renderPermission(event);
      break;
    case "elicitation_request":
      renderElicitation(event);
      break;
    case "permission_resolved": {
      const box = state.permissions.get(event.request_id);
      const said = event.outcome || {};
      const outcome = said.outcome === "selected" ? `answered: ${said.optionId}`
        : said.action === "accept" ? "answered" : said.action === "decline" ? "declined" : "cancelled";
      state.answers.set(event.request_id, outcome);
      if (box) {
        box.querySelector(".answer").replaceChildren(outcome);
        box.classList.remove("open");
      }
      updateNeedsYou();
      break;
    }
    case "turn_ended":
      state.lastTurnEnd = Math.max(state.lastTurnEnd, event.seq || 0);
      endAgentMessage();
      state.currentThought = null;
      // Questions asked before a turn's end cannot be answered any more (an earlier
      // window's turn end leaves the questions after it alone).
      for (const box of state.permissions.values()) {
        if (Number(box.dataset.seq) > (event.seq || 0)) continue;
        const answer = box.querySelector(".answer");
        if (answer.querySelector("button")) answer.replaceChildren("no longer asked");
        box.classList.remove("open");
      }
      updateNeedsYou();
      if (!state.backfill) refreshTotals();
      transcript(
        el("div", { class: "turn-end", "data-turn-end": event.turn_id },
          `turn ${event.state}${event.stop_reason ? ": " + event.stop_reason : ""}${event.error ? ": " + event.error : ""}`,
          forkButton(event.turn_id), rewindButton(event.turn_id)),
      );
      break;
    case "rewound":
      if (state.backfill) break; // the timeline marks what an earlier window shows
      markRewound(event.rewound);
      activity(`rewound to turn ${event.turn_id}: ${event.rewound.length} turn(s) left the conversation${event.saved_ref ? `; the workspace is back as it was then (what it had is on ${event.saved_ref})` : ""}`, event.at);
      break;
    case "change_reviewed":
      // Here or in another window: the changes tab reads them again (changes.js).
      if (!state.backfill) activity(reviewLine(event), event.at);
      break;
    case "notice":
      renderNotice(event);
      break;
    case "egress_refused":
      transcript(el("div", { class: "notice egress", title: event.reason }, egressLine(event)));
      break;
    case "context_warning":
      transcript(el("div", { class: "notice context" },
        `context: ${event.percent}% full (${formatTokens(event.used)} of ${formatTokens(event.size)}); at ${event.threshold}% the session pauses and hands over to a fresh agent session`));
      break;
    case "budget_warning":
      transcript(el("div", { class: "notice budget" },
        `budget: ${event.budget.scope}'s budget is ${event.budget.percent}% used; at 100% the session pauses`));
      break;
    case "progress":
      stepProgress(event);
      break;
    case "resume_outcome":
      activity(`outcome: ${event.outcome}`, event.at);
      break;
    case "pause_requested":
      activity(`pause requested${event.reason ? ": " + event.reason : ""}`, event.at);
      break;
    case "paused":
      if (event.trigger === "idle") activity(`parked while idle (${event.reason || "idle"}); your next message wakes it`, event.at);
      else activity(`paused${event.trigger && event.trigger !== "pause" ? ` (${event.trigger.replace("_", " ")})` : ""}${event.reason ? ": " + event.reason : ""}${event.forced ? " (the turn was cancelled)" : ""}`, event.at);
      break;
    case "snapshot_taken":
      activity(`snapshot (${event.trigger})`, event.at);
      break;
    case "queue":
      if (!state.backfill) renderQueue(event.queue);
      break;
    default:
      break;
  }
}

// ---- launch steps --------------------------------------------------------------------

// What a launch step does, in words (the CLI's `step_name`).
export const STEP_NAMES = {
  launching: "launching the agent",
  initializing: "the agent is starting (initialize)",
  authenticating: "authenticating",
  restoring: "restoring the agent's session",
  opening: "opening an agent session",
  settings: "setting the chosen model and mode again",
};

// The launch step waited in has one activity line, as in the CLI: a `progress` event of
// another step starts a line, the same step's next ones (their detail the agent's newest
// stderr line) update it, and while it waits it says every second for how long (counted
// from the events' times, so the page's clock does not matter). An earlier window's
// events are history: they leave it alone.
export function stepProgress(event) {
  if (state.backfill) return;
  const at = event.at || Date.now();
  let wait = state.step;
  if (wait && wait.step === event.step && wait.line.isConnected) {
    Object.assign(wait, { detail: event.detail, at, seen: Date.now() });
  } else {
    stepEnded(at);
    const line = activity("", at);
    line.dataset.step = event.step;
    wait = { step: event.step, detail: event.detail, began: at, at, seen: Date.now(), ended: null, line };
    wait.timer = setInterval(() => drawStep(wait), 1000);
    state.step = wait;
  }
  drawStep(wait);
}

// Whether an event leaves the step waiting, as in the CLI: one of the step's, a notice, a
// resume's outcome, the state STARTING; any other says the agent is up (or gone).
export function goesOnWithStep(event) {
  return ["progress", "notice", "resume_outcome"].includes(event.type)
    || (event.type === "state" && event.state === "STARTING");
}

// The step waited in is over, at `at`: its line says how long it waited.
export function stepEnded(at) {
  const wait = state.step;
  if (!wait) return;
  state.step = null;
  clearInterval(wait.timer);
  wait.ended = Math.max(at || wait.at, wait.at);
  drawStep(wait);
}

export function drawStep(wait) {
  if (!wait.line.isConnected) {
    clearInterval(wait.timer); // another session was opened
    return;
  }
  const now = wait.ended === null ? wait.at + (Date.now() - wait.seen) : wait.ended;
  const waited = Math.floor(Math.max(0, now - wait.began) / 1000);
  const name = STEP_NAMES[wait.step] || wait.step;
  const said = wait.detail ? `${name}: ${wait.detail}` : name;
  const how = waited < 1 ? "" : wait.ended === null ? ` (still waiting, ${waited} s)` : ` (waited ${waited} s)`;
  wait.line.textContent = `${new Date(wait.began).toLocaleTimeString()} ${said}${how}`;
  wait.line.classList.toggle("waiting", wait.ended === null);
}

// ---- notices -------------------------------------------------------------------------

// A notice that events cannot be read: "events 12–40 are unreadable and skipped: why".
export const UNREADABLE = /^events? (\d+)(?:–(\d+))? (?:is|are) (unreadable and skipped: [\s\S]*)$/;

// Consecutive notices that say the same are one line, with how many there were: each seq
// of a lost range is delivered as a notice of its own.
export function renderNotice(event) {
  const seq = event.seq || 0;
  const said = { message: event.message, first: seq, last: seq, count: 1 };
  const line = (state.backfill || $("#transcript")).lastElementChild;
  if (!line || !line.notice || !continuesNotice(line.notice, said)) {
    const node = el("div", { class: "notice" });
    node.notice = said;
    showNotice(node);
    transcript(node);
    return;
  }
  line.notice.last = seq;
  line.notice.count += 1;
  showNotice(line);
  if (!state.backfill) stickToBottom();
}

// Whether notice line `later` goes on notice line `earlier`: the same message, or the
// same unreadable range from the next seq on (a read that begins inside a lost range
// names it from there: a window's "events 31–40" after an earlier one's "events 11–40").
export function continuesNotice(earlier, later) {
  if (earlier.message === later.message) return true;
  const before = UNREADABLE.exec(earlier.message);
  const after = UNREADABLE.exec(later.message);
  return Boolean(before && after) && before[3] === after[3]
    && (before[2] || before[1]) === (after[2] || after[1])
    && Number(after[1]) === later.first && later.first === earlier.last + 1;
}

export function showNotice(node) {
  const { message, count } = node.notice;
  node.replaceChildren("notice: " + message,
    count > 1 ? el("span", { class: "repeat", title: `said by ${count} events` }, ` ×${count}`) : "");
}

// An earlier window's last notice line and the newer line after it (`next`), when they
// say the same, are one: the newer line, saying what the earlier one said.
export function joinNotices(holder, next) {
  const last = holder.lastElementChild;
  if (!last || !last.notice || !next || !next.notice || !continuesNotice(last.notice, next.notice)) return;
  next.notice = { ...next.notice, message: last.notice.message, first: last.notice.first, count: last.notice.count + next.notice.count };
  showNotice(next);
  last.remove();
}

// The class of an option's button by its ACP kind (`allow` and `deny` for the once kinds).
export const OPTION_CLASSES = { allow_once: "allow", allow_always: "allow-always", reject_once: "deny", reject_always: "deny-always" };

// An elicitation: the agent's message and a form built from its requested schema (text,
// numbers, switches, choices), or a link to visit; answered accept, decline or cancel.
export function renderElicitation(event) {
  if (state.permissions.has(event.request_id)) return;
  const params = event.params || {};
  const schema = params.requestedSchema || {};
  const properties = schema.properties || {};
  const required = new Set(schema.required || []);
  const inputs = new Map();
  const fields = Object.entries(properties).map(([name, property]) => {
    let input;
    if (Array.isArray(property.enum)) {
      input = el("select", { name }, ...property.enum.map((value) => el("option", { value }, String(value))));
    } else if (property.type === "boolean") {
      input = el("input", { type: "checkbox", name });
      input.checked = property.default === true;
    } else {
      const type = property.type === "number" || property.type === "integer" ? "number" : "text";
      input = el("input", { type, name, required: required.has(name) ? "" : null });
      if (property.default !== undefined) input.value = String(property.default);
    }
    inputs.set(name, [property, input]);
    const label = property.title || name;
    return el("label", { class: "field" }, `${label}${required.has(name) ? " *" : ""} `, input,
      property.description ? el("small", {}, ` ${property.description}`) : "");
  });
  const respond = (action) => async (clickEvent) => {
    if (clickEvent) clickEvent.preventDefault();
    const body = { session_id: state.open, request_id: event.request_id, action };
    if (action === "accept" && inputs.size > 0) {
      body.content = {};
      for (const [name, [property, input]] of inputs) {
        if (property.type === "boolean") body.content[name] = input.checked;
        else if (input.value === "") continue;
        else if (property.type === "integer") body.content[name] = parseInt(input.value, 10);
        else if (property.type === "number") body.content[name] = Number(input.value);
        else body.content[name] = input.value;
      }
    }
    try {
      await rpc.call("task.session.elicitation.respond", body);
    } catch (error) {
      sessionError(error);
    }
  };
  const form = el("form", { class: "answer elicitation-form", onsubmit: respond("accept") },
    ...fields,
    // Only a web address is a link (never `javascript:` from an agent).
    /^https?:\/\//.test(params.url || "") ? el("a", { href: params.url, target: "_blank", rel: "noopener noreferrer" }, params.url)
      : params.url ? el("code", {}, params.url) : "",
    el("span", { class: "buttons" },
      el("button", { type: "submit", class: "allow" }, params.url ? "Done" : "Send"),
      el("button", { type: "button", class: "deny", onclick: respond("decline") }, "Decline"),
      el("button", { type: "button", onclick: respond("cancel") }, "Cancel")));
  const box = transcript(
    el("div", { class: "permission elicitation open", role: "group", "aria-label": "the agent asks for input", "data-permission": event.request_id, "data-seq": String(event.seq || 0) },
      el("div", {}, params.message || "The agent asks for input."),
      form,
    ),
  );
  offerQuestion(box, event, "input, select, button");
}

// A question's box is kept by its id; read back from an earlier window, its answer (or
// the end of its turn) came later and it is shown settled, else it is offered (focused).
export function offerQuestion(box, event, focusable) {
  state.permissions.set(event.request_id, box);
  const answered = state.answers.get(event.request_id) || (state.lastTurnEnd > event.seq ? "no longer asked" : null);
  if (answered) {
    box.querySelector(".answer").replaceChildren(answered);
    box.classList.remove("open");
    return;
  }
  updateNeedsYou();
  const first = box.querySelector(focusable);
  if (first && document.activeElement === document.body) first.focus({ preventScroll: true });
}

export function renderPermission(event) {
  // Asked again (the daemon re-asks open questions after a restart): one box per question.
  if (state.permissions.has(event.request_id)) return;
  const params = event.params || {};
  const options = params.options || [];
  const toolCall = params.toolCall || {};
  const tool = toolCall.title || "a tool";
  const answer = (option) => async () => {
    try {
      await rpc.call("task.session.permission.respond", {
        session_id: state.open,
        request_id: event.request_id,
        option_id: option ? option.optionId : undefined,
      });
    } catch (error) {
      sessionError(error);
    }
  };
  const buttons = options.map((option) =>
    el("button", { class: OPTION_CLASSES[option.kind] || "option", "data-option": option.optionId, onclick: answer(option) },
      option.name || option.optionId));
  const command = toolCall.rawInput && toolCall.rawInput.command;
  const box = transcript(
    el("div", { class: "permission open", role: "group", "aria-label": "the agent asks for permission", "data-permission": event.request_id, "data-seq": String(event.seq || 0) },
      `The agent asks to run ${tool}. `,
      command ? el("pre", { class: "command" }, "$ " + command) : "",
      el("span", { class: "answer" }, ...buttons),
    ),
  );
  offerQuestion(box, event, "button");
}

// What a review did to a file, for the activity log.
function reviewLine(event) {
  if (event.action === "reverted") return `reverted ${event.path} (what it held is on ${event.saved_ref})`;
  if (event.action === "kept") return `kept ${event.path}`;
  return `${event.path}'s keep taken back`;
}
