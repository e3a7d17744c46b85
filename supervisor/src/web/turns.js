// @ts-check
// A long session by turn: which turn an event lies in, what the "Show earlier" button
// loads and says, and the search of the conversation. Pure (no page, no daemon):
// `views.js` draws with it, `tests/turns.test.js` runs it under `node --test`.

/**
 * A turn as the timeline gives it (`TurnInfo`, the fields read here).
 * @typedef {{ turn_id: string, event_seq?: number, prompt?: string, started_at: number, rewound?: boolean }} TurnInfo
 */

/**
 * A turn as the page uses it: numbered from 1 in the session's order; `seq` is where its
 * `turn_started` event is in the log (absent for a turn started before that was recorded).
 * @typedef {{ id: string, n: number, seq?: number, prompt: string, startedAt: number, rewound: boolean }} Turn
 */

/**
 * A history entry (`HistoryEntry`, the fields read here).
 * @typedef {{ type: string, content: string, message_id?: string }} HistoryEntry
 */

/** The most characters of a prompt a button or a list shows. */
export const PROMPT_SHOWN = 60;

/**
 * The timeline's turns, numbered, in the order they started.
 * @param {TurnInfo[]} turns
 * @returns {Turn[]}
 */
export function numbered(turns) {
  return turns.map((turn, index) => ({
    id: turn.turn_id,
    n: index + 1,
    seq: typeof turn.event_seq === "number" ? turn.event_seq : undefined,
    prompt: turn.prompt || "",
    startedAt: turn.started_at,
    rewound: Boolean(turn.rewound),
  }));
}

/**
 * A turn that started live (its `turn_started` event), added unless known.
 * @param {Turn[]} turns
 * @param {{ turn_id: string, seq: number, prompt?: string, at?: number }} event
 * @returns {Turn[]}
 */
export function withStarted(turns, event) {
  if (turns.some((turn) => turn.id === event.turn_id)) return turns;
  const turn = {
    id: event.turn_id,
    n: turns.length + 1,
    seq: event.seq,
    prompt: event.prompt || "",
    startedAt: event.at || 0,
    rewound: false,
  };
  return turns.concat([turn]);
}

/**
 * The turn event `seq` lies in: the last whose start is at or before it.
 * @param {Turn[]} turns
 * @param {number} seq
 * @returns {Turn | undefined}
 */
export function turnAt(turns, seq) {
  let found;
  for (const turn of turns) {
    if (turn.seq !== undefined && turn.seq <= seq && (!found || turn.seq >= (found.seq ?? 0))) {
      found = turn;
    }
  }
  return found;
}

/**
 * The newest turn whose start is known.
 * @param {Turn[]} turns
 * @returns {Turn | undefined}
 */
export function newest(turns) {
  return turnAt(turns, Number.MAX_SAFE_INTEGER);
}

/**
 * `text` cut to `max` characters on one line, "…" where cut.
 * @param {string} text
 * @param {number} [max]
 */
export function shortly(text, max = PROMPT_SHOWN) {
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > max ? line.slice(0, max - 1) + "…" : line;
}

/**
 * What the button above the oldest event shown loads and says: back to the start of the
 * turn that event's predecessor lies in (the rest of a turn the window starts inside, or
 * the whole turn before), at most `cap` events; by count where no turn says where it
 * starts, or its start is no longer kept.
 * @param {Turn[]} turns
 * @param {number} bound the oldest event seq shown
 * @param {number} keptAfter events up to this seq are no longer kept
 * @param {number} cap the most events one load reads
 * @returns {{ limit: number, label: string, turn?: Turn }}
 */
export function earlierStep(turns, bound, keptAfter, cap) {
  const left = bound - keptAfter - 1;
  const turn = turnAt(turns, bound - 1);
  if (!turn || turn.seq === undefined || turn.seq <= keptAfter) {
    return { limit: Math.min(cap, left), label: `Show earlier events (${left} more)` };
  }
  const rest = bound - turn.seq;
  const limit = Math.min(cap, rest);
  const inside = !turns.some((other) => other.seq === bound);
  const events = rest === 1 ? "1 event" : `${rest} events`;
  const more = limit < rest ? ` (${events}, ${limit} at a time)` : ` (${events})`;
  const label = inside
    ? `Show earlier: the rest of turn ${turn.n}${more}`
    : `Show earlier: turn ${turn.n} · ${shortly(turn.prompt)}${more}`;
  return { limit, label, turn };
}

/**
 * Where `query` occurs in the conversation (case ignored): each match with its turn (the
 * user message before it names it) and the text around it, at most `max`.
 * @param {HistoryEntry[]} entries oldest first
 * @param {string} query
 * @param {number} [max]
 * @returns {{ turnId: string | undefined, type: string, excerpt: string }[]}
 */
export function searchHistory(entries, query, max = 50) {
  const needle = query.trim().toLowerCase();
  if (!needle) return [];
  const found = [];
  let turnId;
  for (const entry of entries) {
    if (entry.type === "user_message" && entry.message_id) turnId = entry.message_id;
    const at = entry.content.toLowerCase().indexOf(needle);
    if (at < 0) continue;
    const start = Math.max(0, at - 40);
    const end = Math.min(entry.content.length, at + needle.length + 40);
    const excerpt = (start > 0 ? "…" : "") + entry.content.slice(start, end).replace(/\s+/g, " ")
      + (end < entry.content.length ? "…" : "");
    found.push({ turnId, type: entry.type, excerpt });
    if (found.length >= max) break;
  }
  return found;
}
