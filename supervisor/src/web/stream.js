// @ts-check
// A streamed message's Markdown, its pure parts: which blocks of the open tail are settled
// (rendered for good, never lexed again), and the code fence left open, grown as text
// until a line closes it. `render.js` draws with them; `tests/stream.test.js` runs them
// under `node --test` over the vendored marked's real tokens.

/**
 * A token of marked's lexer (the fields read here).
 * @typedef {{ type: string, raw: string }} Token
 */

/**
 * A chunk's line ends as marked reads them: "\r\n" and "\r" are "\n", and a "\r\n" may be
 * cut in two by the chunks (`pendingCr`: the chunk before ended with "\r").
 * @param {boolean} pendingCr
 * @param {string} chunk
 * @returns {{ text: string, cr: boolean }} the text to add, and whether it ends with "\r"
 */
export function lineEnds(pendingCr, chunk) {
  const more = pendingCr && chunk.startsWith("\n") ? chunk.slice(1) : chunk;
  return { text: more.replace(/\r\n?/g, "\n"), cr: more.endsWith("\r") };
}

/**
 * The index of the last block before `end` that is not blank lines (0 when none is).
 * @param {Token[]} tokens
 * @param {number} end
 */
export function lastBlock(tokens, end) {
  let index = end - 1;
  while (index > 0 && tokens[index].type === "space") index--;
  return Math.max(index, 0);
}

/**
 * How many of the open tail's tokens are settled: all blocks but the last (and the blank
 * lines after it). While the last one's first line is not whole, the block before it is
 * not settled either ("2" may yet be "2. second", an item of the list above).
 * @param {Token[]} tokens
 */
export function settledCount(tokens) {
  let last = lastBlock(tokens, tokens.length);
  if (!tokens.slice(last).some((token) => token.raw.includes("\n"))) last = lastBlock(tokens, last);
  return last;
}

/**
 * A code block's raw text when it is a fence still open, its opening line whole: the
 * pattern of the line that closes it, and its code; else null.
 * @param {string} raw
 * @returns {{ closing: RegExp, code: string } | null}
 */
export function openFence(raw) {
  const opening = /^(`{3,}|~{3,})[^\n]*\n/.exec(raw);
  if (!opening) return null;
  const mark = opening[1];
  const closing = new RegExp(`^ {0,3}${mark}${mark[0]}* *$`);
  const code = raw.slice(opening[0].length);
  if (code.split("\n").some((line) => closing.test(line))) return null;
  return { closing, code };
}

/**
 * Reads `text`'s whole lines from `at` for one that closes the fence.
 * @param {string} text
 * @param {number} at where the first line not read yet starts
 * @param {RegExp} closing
 * @returns {{ closed: boolean, scanFrom: number }} whether one does, and where the next
 *   read starts (the line not whole yet)
 */
export function scanFence(text, at, closing) {
  for (let end = text.indexOf("\n", at); end >= 0; end = text.indexOf("\n", at)) {
    if (closing.test(text.slice(at, end))) return { closed: true, scanFrom: at };
    at = end + 1;
  }
  return { closed: false, scanFrom: at };
}
