// A long session's windows (windows.js), as `scripts/test.sh` runs them: `node --test`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { startsInsideMessage, messageStart } from "../windows.js";

const ev = (seq, type) => ({ seq, type });

test("a window that opens on a chunk before any end begins inside a message", () => {
  assert.equal(startsInsideMessage([ev(5, "agent_message_chunk"), ev(6, "turn_ended")]), true);
  assert.equal(startsInsideMessage([ev(5, "state"), ev(6, "agent_thought_chunk")]), true, "a thought too");
  assert.equal(startsInsideMessage([ev(5, "tool_call"), ev(6, "agent_message_chunk")]), false, "a tool call ended it");
  assert.equal(startsInsideMessage([ev(5, "turn_started"), ev(6, "agent_message_chunk")]), false);
  assert.equal(startsInsideMessage([ev(5, "state"), ev(6, "usage")]), false, "no message at all");
  assert.equal(startsInsideMessage([]), false);
});

test("the message a window begins inside starts after the last event that ended one", () => {
  const before = [ev(1, "turn_started"), ev(2, "agent_message_chunk"), ev(3, "tool_call"),
    ev(4, "agent_message_chunk"), ev(5, "usage"), ev(6, "agent_message_chunk")];
  assert.equal(messageStart(before), 3, "after the tool call: seqs 4–6");
  assert.equal(messageStart([ev(7, "agent_message_chunk"), ev(8, "agent_message_chunk")]), 0,
    "no end in sight: it may start earlier still");
  assert.equal(messageStart([ev(9, "turn_ended")]), 1, "ended just before: nothing to take");
});
