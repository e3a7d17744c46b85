// The lists' pure parts (lists.js), as `scripts/test.sh` runs them: `node --test`;
// `reconcile` over a small stand-in for the DOM.
import { test } from "node:test";
import assert from "node:assert/strict";
import { needsYou, matchesList, reconcile } from "../lists.js";

const session = (id, state, more = {}) =>
  ({ id, state, agent_profile_id: "mock", task_id: "t1", workspace_path: "/work/app", ...more });
const all = { query: "", state: "", agent: "", task: "" };

test("a session needs you while its agent asks, or its finished turn is unseen", () => {
  assert.equal(needsYou(session("a", "RUNNING", { awaiting_permission: true }), new Set()), true);
  assert.equal(needsYou(session("b", "WAITING_FOR_INPUT"), new Set(["b"])), true);
  assert.equal(needsYou(session("b", "RUNNING"), new Set(["b"])), false, "working again");
  assert.equal(needsYou(session("c", "WAITING_FOR_INPUT"), new Set()), false);
});

test("the list's filters and search reduce the sessions shown", () => {
  const sessions = [
    session("s1", "RUNNING"),
    session("s2", "COMPLETED", { agent_profile_id: "claude", worktree_branch: "tether/fix-login" }),
    session("s3", "WAITING_FOR_INPUT", { task_id: "t2" }),
  ];
  const tasks = { t1: { title: "Fix the login page" }, t2: { title: "Write docs" } };
  const shown = (filter, unseen = new Set()) => sessions
    .filter((s) => matchesList(s, tasks[s.task_id], { ...all, ...filter }, unseen)).map((s) => s.id);
  assert.deepEqual(shown({}), ["s1", "s2", "s3"]);
  assert.deepEqual(shown({ state: "ended" }), ["s2"]);
  assert.deepEqual(shown({ state: "RUNNING" }), ["s1"]);
  assert.deepEqual(shown({ state: "needs-you" }, new Set(["s3"])), ["s3"]);
  assert.deepEqual(shown({ agent: "claude" }), ["s2"]);
  assert.deepEqual(shown({ task: "t2" }), ["s3"]);
  assert.deepEqual(shown({ query: "LOGIN fix" }), ["s1", "s2"], "every word, in the task's title or the branch");
  assert.deepEqual(shown({ query: "docs waiting" }), ["s3"]);
  assert.deepEqual(shown({ query: "nothing-like-this" }), []);
});

// A stand-in for the DOM, as much of it as `reconcile` touches.
class Node {
  constructor(name) { this.name = name; this.children = []; this.parent = null; this.label = null; }
  get isConnected() { let node = this; while (node.parent) node = node.parent; return node.root === true; }
  get lastElementChild() { return this.children[this.children.length - 1] || null; }
  contains(other) { for (let n = other; n; n = n.parent) if (n === this) return true; return false; }
  insertBefore(node, before) {
    if (node.parent) node.parent.children.splice(node.parent.children.indexOf(node), 1);
    const at = before ? this.children.indexOf(before) : this.children.length;
    this.children.splice(at, 0, node);
    node.parent = this;
    if (globalThis.document.activeElement && this.contains(globalThis.document.activeElement) && node.contains(globalThis.document.activeElement)) {
      globalThis.document.activeElement = null; // a moved node loses the focus, as in a browser
    }
  }
  append(node) { this.insertBefore(node, null); }
  remove() {
    this.parent.children.splice(this.parent.children.indexOf(this), 1);
    this.parent = null;
    if (this.contains(globalThis.document.activeElement)) globalThis.document.activeElement = null; // focus to the body
  }
  getAttribute(name) { return name === "aria-label" ? this.label : null; }
  querySelector() { return this.children.find((child) => child.label !== null) || null; }
  focus() { globalThis.document.activeElement = this; }
}
globalThis.document = { activeElement: null };
globalThis.CSS = { escape: (text) => text };

test("a list is updated in place: unchanged rows stay, changed ones are rebuilt, the focus stays", () => {
  const list = new Node("ul");
  list.root = true; // in the document
  let built = 0;
  const draw = (items) => reconcile(list, items, (item) => item.id, (item) => item.text,
    (item) => { built += 1; const row = new Node(item.text); const button = new Node("button"); button.label = item.id; row.append(button); return row; });
  draw([{ id: "a", text: "A" }, { id: "b", text: "B" }, { id: "c", text: "C" }]);
  assert.equal(built, 3);
  const [rowA, rowB] = list.children;
  rowB.children[0].focus();
  draw([{ id: "a", text: "A" }, { id: "b", text: "B" }, { id: "c", text: "C2" }]);
  assert.equal(built, 4, "only the changed row was built again");
  assert.equal(list.children[0], rowA);
  assert.equal(globalThis.document.activeElement, rowB.children[0], "the focus did not move");
  // B moves to the top: it loses the focus in the move, and gets it back.
  draw([{ id: "b", text: "B" }, { id: "a", text: "A" }, { id: "c", text: "C2" }]);
  assert.deepEqual(list.children.map((row) => row.name), ["B", "A", "C2"]);
  assert.equal(globalThis.document.activeElement, rowB.children[0], "the focus went back");
  // B is rebuilt while it has the focus: the new row's button with the same label gets it.
  draw([{ id: "b", text: "B2" }, { id: "a", text: "A" }]);
  assert.deepEqual(list.children.map((row) => row.name), ["B2", "A"], "C is gone");
  assert.equal(globalThis.document.activeElement, list.children[0].children[0]);
  assert.deepEqual([...list.keyed.keys()].sort(), ["a", "b"], "what is gone is forgotten");
});
