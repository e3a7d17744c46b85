// A long session by turn (turns.js), as `scripts/test.sh` runs it: `node --test`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { numbered, withStarted, turnAt, newest, shortly, earlierStep, searchHistory } from "../turns.js";

const TIMELINE = [
  { turn_id: "t1", event_seq: 3, prompt: "fix the build", started_at: 10 },
  { turn_id: "t2", started_at: 20 }, // started before seqs were recorded
  { turn_id: "t3", event_seq: 40, prompt: "now   the\ntests", started_at: 30, rewound: true },
  { turn_id: "t4", event_seq: 90, prompt: "and the docs", started_at: 40 },
];

test("the timeline's turns are numbered in order, their starts kept where known", () => {
  const turns = numbered(TIMELINE);
  assert.deepEqual(turns.map((t) => [t.id, t.n, t.seq, t.rewound]),
    [["t1", 1, 3, false], ["t2", 2, undefined, false], ["t3", 3, 40, true], ["t4", 4, 90, false]]);
  assert.equal(turns[1].prompt, "");
});

test("an event lies in the last turn started at or before it", () => {
  const turns = numbered(TIMELINE);
  assert.equal(turnAt(turns, 2), undefined, "before the first prompt");
  assert.equal(turnAt(turns, 3)?.id, "t1");
  assert.equal(turnAt(turns, 39)?.id, "t1", "a turn without a known start is skipped");
  assert.equal(turnAt(turns, 40)?.id, "t3");
  assert.equal(turnAt(turns, 5000)?.id, "t4");
  assert.equal(newest(turns)?.id, "t4");
  assert.equal(newest([]), undefined);
});

test("a turn started live joins once, numbered next", () => {
  const turns = numbered(TIMELINE);
  const more = withStarted(turns, { turn_id: "t5", seq: 120, prompt: "ship it", at: 50 });
  assert.deepEqual(more.map((t) => [t.id, t.n, t.seq]).slice(-1), [["t5", 5, 120]]);
  assert.equal(withStarted(more, { turn_id: "t5", seq: 120 }), more, "known: unchanged");
});

test("a prompt is shown on one line, cut with an ellipsis", () => {
  assert.equal(shortly("now   the\ntests"), "now the tests");
  assert.equal(shortly("abcdef", 4), "abc…");
  assert.equal(shortly("abcd", 4), "abcd");
});

test("the button loads the rest of the turn the window starts inside", () => {
  const turns = numbered(TIMELINE);
  // The window starts at 150, inside turn 4 (started at 90): back to its prompt.
  const step = earlierStep(turns, 150, 0, 5000);
  assert.equal(step.limit, 60);
  assert.equal(step.turn?.id, "t4");
  assert.equal(step.label, "Show earlier: the rest of turn 4 (60 events)");
});

test("at a turn's start the button loads the whole turn before, named by its prompt", () => {
  const turns = numbered(TIMELINE);
  const step = earlierStep(turns, 90, 0, 5000);
  assert.equal(step.limit, 50, "seqs 40–89");
  assert.equal(step.label, "Show earlier: turn 3 · now the tests (50 events)");
});

test("one event is said as one", () => {
  const turns = numbered(TIMELINE);
  assert.equal(earlierStep(turns, 41, 0, 5000).label, "Show earlier: the rest of turn 3 (1 event)");
});

test("a turn longer than a load is read a cap at a time, and says so", () => {
  const turns = numbered(TIMELINE);
  const step = earlierStep(turns, 90, 0, 20);
  assert.equal(step.limit, 20);
  assert.equal(step.label, "Show earlier: turn 3 · now the tests (50 events, 20 at a time)");
});

test("without a known start, or past the log's start, the button counts events", () => {
  const turns = numbered(TIMELINE);
  assert.deepEqual(earlierStep(turns, 3, 0, 500), { limit: 2, label: "Show earlier events (2 more)" });
  assert.deepEqual(earlierStep([], 700, 100, 500), { limit: 500, label: "Show earlier events (599 more)" });
  // Turn 1's start (3) is no longer kept: by count, down to the log's start.
  assert.deepEqual(earlierStep(turns, 30, 10, 500), { limit: 19, label: "Show earlier events (19 more)" });
});

test("search finds each match with its turn and the text around it", () => {
  const entries = [
    { type: "user_message", content: "fix the build", message_id: "t1" },
    { type: "agent_message", content: "The Build was broken by a missing semicolon in lib.rs; fixed." },
    { type: "user_message", content: "now the tests", message_id: "t2" },
    { type: "tool_call", content: "cargo build" },
  ];
  const found = searchHistory(entries, "  BUILD ");
  assert.deepEqual(found.map((f) => [f.turnId, f.type]),
    [["t1", "user_message"], ["t1", "agent_message"], ["t2", "tool_call"]]);
  assert.equal(found[1].excerpt, "The Build was broken by a missing semicolon in li…");
  assert.deepEqual(searchHistory(entries, "   "), [], "nothing asked, nothing found");
  assert.equal(searchHistory(entries, "build", 2).length, 2, "at most max");
});
