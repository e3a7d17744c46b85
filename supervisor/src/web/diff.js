// @ts-check
// The pure parts of the review (changes.js): a unified diff read into hunks and paired
// side by side, a review's totals, and its line comments put into one prompt. No DOM here:
// `node --test` runs web/tests against this module as the browser loads it.

/** @typedef {"ctx" | "del" | "ins"} LineKind */
/** @typedef {{ kind: LineKind, text: string, old?: number, new?: number }} Line */
/** @typedef {{ header: string, oldStart: number, newStart: number, lines: Line[] }} Hunk */
/** @typedef {{ n: number, text: string, kind: LineKind }} Side */
/** @typedef {{ left: Side | null, right: Side | null }} Pair */
/** @typedef {{ gap: string }} Gap */
/** @typedef {Pair | Gap} Row */
/** @typedef {{ path: string, side: "old" | "new", line: number, quote: string, text: string }} Comment */

const HUNK = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)$/;

/**
 * The hunks of one file's unified diff (`git diff` text, its header lines skipped).
 * @param {string} diff
 * @returns {Hunk[]}
 */
export function parseHunks(diff) {
  /** @type {Hunk[]} */
  const hunks = [];
  /** @type {Hunk | null} */
  let hunk = null;
  let oldLine = 0;
  let newLine = 0;
  for (const line of diff.split("\n")) {
    const start = HUNK.exec(line);
    if (start) {
      oldLine = Number(start[1]);
      newLine = Number(start[2]);
      hunk = { header: line, oldStart: oldLine, newStart: newLine, lines: [] };
      hunks.push(hunk);
    } else if (!hunk || line.startsWith("\\")) {
      // The file's header, or "\ No newline at end of file".
    } else if (line.startsWith("+")) {
      hunk.lines.push({ kind: "ins", text: line.slice(1), new: newLine++ });
    } else if (line.startsWith("-")) {
      hunk.lines.push({ kind: "del", text: line.slice(1), old: oldLine++ });
    } else if (line.startsWith(" ")) {
      hunk.lines.push({ kind: "ctx", text: line.slice(1), old: oldLine++, new: newLine++ });
    }
  }
  return hunks;
}

/**
 * Rows of a side-by-side view: each hunk's heading, then its lines with removed and
 * added lines paired up (the old text left, the new right).
 * @param {Hunk[]} hunks
 * @returns {Row[]}
 */
export function sideBySide(hunks) {
  /** @type {Row[]} */
  const rows = [];
  for (const hunk of hunks) {
    rows.push({ gap: hunk.header });
    /** @type {Line[]} */
    let removed = [];
    /** @type {Line[]} */
    let added = [];
    const flush = () => {
      for (let k = 0; k < Math.max(removed.length, added.length); k++) {
        rows.push({ left: side(removed[k], "old"), right: side(added[k], "new") });
      }
      removed = [];
      added = [];
    };
    for (const line of hunk.lines) {
      if (line.kind === "del") removed.push(line);
      else if (line.kind === "ins") added.push(line);
      else {
        flush();
        rows.push({ left: side(line, "old"), right: side(line, "new") });
      }
    }
    flush();
  }
  return rows;
}

/**
 * @param {Line | undefined} line
 * @param {"old" | "new"} which
 * @returns {Side | null}
 */
function side(line, which) {
  if (!line) return null;
  const n = which === "old" ? line.old : line.new;
  return n === undefined ? null : { n, text: line.text, kind: line.kind };
}

/**
 * A review's totals: files, lines added and removed, files kept.
 * @param {{ additions?: number, deletions?: number, kept: boolean }[]} files
 */
export function totals(files) {
  let additions = 0;
  let deletions = 0;
  let kept = 0;
  for (const file of files) {
    additions += file.additions || 0;
    deletions += file.deletions || 0;
    if (file.kept) kept += 1;
  }
  return { files: files.length, additions, deletions, kept };
}

/**
 * One prompt to the agent with every line comment, by file and line, each with the line
 * it is about quoted.
 * @param {Comment[]} comments
 * @returns {string}
 */
export function commentsPrompt(comments) {
  const sorted = [...comments].sort((a, b) =>
    a.path === b.path ? a.line - b.line : a.path < b.path ? -1 : 1);
  const parts = sorted.map((c) => {
    const where = `${c.path}, line ${c.line}${c.side === "old" ? " (before your change)" : ""}`;
    return `${where}:\n> ${c.quote}\n${c.text.trim()}`;
  });
  const count = comments.length === 1 ? "a comment" : `${comments.length} comments`;
  return `Review of your changes: ${count}. Please address each.\n\n${parts.join("\n\n")}`;
}
