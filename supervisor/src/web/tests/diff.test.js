// The review's pure parts (diff.js), as `scripts/test.sh` runs them: `node --test`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseHunks, sideBySide, totals, commentsPrompt } from "../diff.js";

const DIFF = `diff --git a/f b/f
index 1..2 100644
--- a/f
+++ b/f
@@ -1,4 +1,5 @@ fn main
 a
-b
-c
+B
+C
+D
 d
\\ No newline at end of file
@@ -10 +11 @@
-old
+new
`;

test("a unified diff is read into hunks with both sides' line numbers", () => {
  const hunks = parseHunks(DIFF);
  assert.equal(hunks.length, 2);
  assert.equal(hunks[0].oldStart, 1);
  assert.deepEqual(hunks[0].lines.map((l) => [l.kind, l.old, l.new]), [
    ["ctx", 1, 1], ["del", 2, undefined], ["del", 3, undefined],
    ["ins", undefined, 2], ["ins", undefined, 3], ["ins", undefined, 4], ["ctx", 4, 5],
  ]);
  // The header's "--- a/f" and "+++ b/f" are not lines of the file.
  assert.ok(hunks.every((h) => h.lines.every((l) => !l.text.startsWith("-- ") && !l.text.startsWith("++ "))));
  assert.deepEqual(hunks[1].lines.map((l) => [l.kind, l.old ?? l.new]), [["del", 10], ["ins", 11]]);
});

test("removed and added lines are paired side by side, the surplus against nothing", () => {
  const rows = sideBySide(parseHunks(DIFF));
  const shown = rows.map((r) => ("gap" in r ? "@@"
    : `${r.left ? r.left.n + r.left.text : "·"}|${r.right ? r.right.n + r.right.text : "·"}`));
  assert.deepEqual(shown, ["@@", "1a|1a", "2b|2B", "3c|3C", "·|4D", "4d|5d", "@@", "10old|11new"]);
});

test("a new file's diff has only a right side", () => {
  const rows = sideBySide(parseHunks("--- /dev/null\n+++ b/n\n@@ -0,0 +1,2 @@\n+x\n+y\n"));
  assert.deepEqual(rows.slice(1).map((r) => "left" in r && [r.left, r.right?.n]), [[null, 1], [null, 2]]);
});

test("totals count files, lines and keeps; a binary file counts no lines", () => {
  assert.deepEqual(totals([{ additions: 3, deletions: 1, kept: true }, { kept: false }]),
    { files: 2, additions: 3, deletions: 1, kept: 1 });
});

test("comments become one prompt ordered by file and line, each quoting its line", () => {
  const prompt = commentsPrompt([
    { path: "src/b.rs", side: "new", line: 9, quote: "let x = 1;", text: "name it\n" },
    { path: "src/a.rs", side: "old", line: 3, quote: "keep()", text: "why was this removed?" },
    { path: "src/b.rs", side: "new", line: 2, quote: "use y;", text: "unused" },
  ]);
  assert.match(prompt, /^Review of your changes: 3 comments\./);
  const order = ["src/a.rs, line 3 (before your change):\n> keep()\nwhy was this removed?",
    "src/b.rs, line 2:\n> use y;\nunused", "src/b.rs, line 9:\n> let x = 1;\nname it"];
  assert.ok(prompt.endsWith(order.join("\n\n")), prompt);
});
