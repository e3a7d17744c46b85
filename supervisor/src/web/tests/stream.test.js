// A streamed message's Markdown (stream.js), as `scripts/test.sh` runs it: `node --test`,
// over the tokens of the page's own vendored marked.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { lineEnds, lastBlock, settledCount, openFence, scanFence } from "../stream.js";

// The vendored marked (a UMD script), loaded as the page loads it, into a module object.
const loaded = { exports: {} };
new Function("module", "exports", readFileSync(new URL("../vendor/marked.umd.js", import.meta.url), "utf8"))(loaded, loaded.exports);
const lex = (text) => new loaded.exports.Lexer({ gfm: true }).lex(text);

test("line ends are read as marked reads them, a \\r\\n cut in two included", () => {
  assert.deepEqual(lineEnds(false, "a\r\nb\rc\n"), { text: "a\nb\nc\n", cr: false });
  const first = lineEnds(false, "one\r");
  assert.deepEqual(first, { text: "one\n", cr: true });
  assert.deepEqual(lineEnds(first.cr, "\ntwo"), { text: "two", cr: false }, "its \\n is the same line end");
  assert.deepEqual(lineEnds(false, "\ntwo"), { text: "\ntwo", cr: false });
});

test("all blocks but the last are settled, once the last one's first line is whole", () => {
  const settledOf = (text) => { const tokens = lex(text); return tokens.slice(0, settledCount(tokens)).map((t) => t.raw).join(""); };
  assert.equal(settledOf("# Title\n\nA paragraph.\n\nThe last one, its first line whole\nand"),
    "# Title\n\nA paragraph.\n\n");
  // Its first line not whole yet, the last block may still join the one before.
  assert.equal(settledOf("# Title\n\nA paragraph.\n\nThe last one, still strea"), "# Title\n\n");
  // The tail "2" may yet be "2. second": the list before it is not settled either.
  const list = lex("Intro.\n\n1. first\n2");
  const open = list.slice(settledCount(list)).map((t) => t.raw).join("");
  assert.ok(open.startsWith("1. first"), JSON.stringify(open));
  assert.equal(settledCount([]), 0);
  assert.equal(lastBlock(lex("a\n\n\n"), lex("a\n\n\n").length), 0, "blank lines are not a block");
});

test("a fence still open is found with what closes it; a closed or indented one is not", () => {
  const [code] = lex("```rust\nfn main() {\n    println!(\"```\");\n");
  const fence = openFence(code.raw);
  assert.ok(fence, "open");
  assert.equal(fence.code, "fn main() {\n    println!(\"```\");\n");
  assert.ok(fence.closing.test("```") && fence.closing.test("   ````") && !fence.closing.test("    ```"));
  assert.ok(!fence.closing.test("``` rust"), "a closing line has no info string");
  assert.equal(openFence("```\ncode\n```\n"), null, "closed");
  assert.equal(openFence("~~~~\n~~~\nstill code\n").closing.test("~~~"), false, "a shorter mark does not close");
  assert.equal(openFence("    indented code\n"), null);
});

test("an open fence's new lines are read once each, up to the line that closes it", () => {
  const { closing } = openFence("```sh\n");
  let text = "```sh\necho one\necho tw";
  let scanned = scanFence(text, 6, closing);
  assert.deepEqual(scanned, { closed: false, scanFrom: 15 }, "the line not whole waits");
  text += "o\n```\nafter";
  scanned = scanFence(text, scanned.scanFrom, closing);
  assert.deepEqual(scanned, { closed: true, scanFrom: 24 });
});
