// @ts-check
// The lists' pure parts: which sessions the list shows (its search and filters) and which
// need a person, and `reconcile`, a list's children updated in place. `list.js`,
// `app.js` and `changes.js` use them; `tests/lists.test.js` runs them under `node --test`
// (`reconcile` over a small stand-in for the DOM).

/**
 * A session as the list reads it (`SessionSummary`, the fields read here).
 * @typedef {{ id: string, state: string, agent_profile_id: string, task_id: string,
 *   workspace_path?: string, worktree_branch?: string, awaiting_permission?: boolean }} ListedSession
 */

/**
 * The list's search and filters (`state.list`).
 * @typedef {{ query: string, state: string, agent: string, task: string }} ListFilter
 */

/** The states a session ends in. */
export const ENDED = ["COMPLETED", "CANCELLED"];

/**
 * A session needs a person: its agent waits for a permission answer, or it finished a
 * turn nobody has looked at yet (`unseen`).
 * @param {ListedSession} session
 * @param {Set<string>} unseen
 */
export function needsYou(session, unseen) {
  return Boolean(session.awaiting_permission || (unseen.has(session.id) && session.state === "WAITING_FOR_INPUT"));
}

/**
 * Whether the list shows `session` (of `task`) under `filter`: its state ("needs-you",
 * "ended" or a state), agent and task, and every word of the search in its id, agent,
 * state, workspace, branch or task's title.
 * @param {ListedSession} session
 * @param {{ title: string } | undefined} task
 * @param {ListFilter} filter
 * @param {Set<string>} unseen
 */
export function matchesList(session, task, filter, unseen) {
  const f = filter;
  if (f.state === "needs-you" && !needsYou(session, unseen)) return false;
  if (f.state === "ended" && !ENDED.includes(session.state)) return false;
  if (f.state && !["needs-you", "ended"].includes(f.state) && session.state !== f.state) return false;
  if (f.agent && session.agent_profile_id !== f.agent) return false;
  if (f.task && session.task_id !== f.task) return false;
  if (!f.query) return true;
  const haystack = [session.id, session.agent_profile_id, session.state, session.workspace_path,
    session.worktree_branch, task ? task.title : ""].join(" ").toLowerCase();
  return f.query.toLowerCase().split(/\s+/).filter(Boolean).every((word) => haystack.includes(word));
}

// Keeps `holder`'s children as `items` say, keyed: a child whose signature did not change
// stays the node it was (its focus, scroll and selection with it), only changed children
// are built again, and none is moved unless the order changed. The focus stays where it
// was (on the rebuilt child, when the one that had it was rebuilt).
/**
 * @template T
 * @param {any} holder the list's element
 * @param {T[]} items what it shows, in order
 * @param {(item: T) => string} keyOf
 * @param {(item: T) => string} signatureOf what changes when its child must be built again
 * @param {(item: T) => Element} build
 */
export function reconcile(holder, items, keyOf, signatureOf, build) {
  if (!holder.keyed) holder.keyed = new Map();
  const known = holder.keyed;
  const focused = holder.contains(document.activeElement) ? document.activeElement : null;
  /** @type {any} */
  let rebuilt = null; // the child built anew in place of the one that held the focus
  const nodes = items.map((item) => {
    const key = keyOf(item);
    const signature = signatureOf(item);
    const had = known.get(key);
    if (had && had.signature === signature) return had.node;
    const node = build(item);
    if (focused && had && had.node.contains(focused)) rebuilt = node;
    known.set(key, { signature, node });
    return node;
  });
  nodes.forEach((node, at) => {
    const there = holder.children[at];
    if (there !== node) holder.insertBefore(node, there || null);
  });
  while (holder.children.length > nodes.length) holder.lastElementChild.remove();
  const keys = new Set(items.map(keyOf));
  for (const key of known.keys()) if (!keys.has(key)) known.delete(key);
  // A node moved in the document loses the focus, and a rebuilt one is new: the focus goes
  // back where it was (in a rebuilt child, to what has the same label, else the child).
  if (!focused || document.activeElement === focused) return;
  /** @type {any} */
  let target = focused.isConnected ? focused : null;
  if (!target && rebuilt) {
    const label = focused.getAttribute("aria-label");
    target = (label && rebuilt.querySelector(`[aria-label="${CSS.escape(label)}"]`)) || rebuilt;
  }
  if (target) target.focus({ preventScroll: true });
}
