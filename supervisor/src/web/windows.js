// @ts-check
// A long session's windows of events: where a window may start so that no message of the
// agent is rendered in two parts (its Markdown cut in two would show code as prose and a
// fence as text). Pure: `views.js` reads the windows with it, `tests/windows.test.js`
// runs it under `node --test`.

/**
 * An event as the window reads it (`SessionEvent`: its `type` and `seq`).
 * @typedef {{ type: string, seq: number }} WindowEvent
 */

/** The events after which a new block starts: the agent's message streamed before is over. */
export const MESSAGE_ENDS = new Set(["turn_started", "turn_ended", "tool_call", "tool_call_update", "permission_request", "elicitation_request"]);

/**
 * Whether a window's events begin inside a message: a chunk of the agent's message (or
 * thought) comes before any event that ends one.
 * @param {WindowEvent[]} events
 */
export function startsInsideMessage(events) {
  for (const event of events) {
    if (event.type === "agent_message_chunk" || event.type === "agent_thought_chunk") return true;
    if (MESSAGE_ENDS.has(event.type)) return false;
  }
  return false;
}

/**
 * Where, in `before` (the events just before a window that begins inside a message), that
 * message starts: the index after the last event that ended a message (0 when none did:
 * it may start earlier still).
 * @param {WindowEvent[]} before
 */
export function messageStart(before) {
  let start = before.length;
  while (start > 0 && !MESSAGE_ENDS.has(before[start - 1].type)) start--;
  return start;
}
