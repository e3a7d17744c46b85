//! History injection: the resume context wrapped around the first prompt after a resume
//! that could not restore the agent's own memory (DESIGN §6.3).
//!
//! The history is read from its end, newest entry first, until the character budget is
//! spent, so the cost is bounded by the budget and not by the size of the file. Messages
//! are cut at 2,000 characters and tool results at 500, always on character boundaries.

use std::io::{self, Read, Seek, SeekFrom};

use crate::history::{EntryType, HistoryEntry, excerpt};

/// The most characters of one user or agent message in the context.
pub const MESSAGE_CHARS: usize = 2000;
/// The most characters of one tool result in the context.
pub const TOOL_RESULT_CHARS: usize = 500;
/// The bytes read from the file per step backwards.
const CHUNK: u64 = 64 * 1024;

/// The context and what it cost to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeContext {
    /// The wrapped prompt.
    pub text: String,
    /// Entries included.
    pub included: usize,
    /// Older entries left out for the budget.
    pub omitted: u64,
    /// Bytes of the history file read.
    pub bytes_read: u64,
}

/// One entry as it appears in the context: a multi-line text's later lines are indented
/// under its tag, so that every line of the history starts with a tag or with spaces —
/// never like a command the agent would act on again (`/write …` in an earlier prompt).
fn render(entry: &HistoryEntry) -> String {
    let name = entry.tool_name.as_deref().unwrap_or("tool");
    let text = |limit: usize| excerpt(&entry.content, limit).replace('\n', "\n  ");
    match entry.kind {
        EntryType::UserMessage => format!("[USER]: {}", text(MESSAGE_CHARS)),
        EntryType::AgentMessage => format!("[ASSISTANT]: {}", text(MESSAGE_CHARS)),
        EntryType::ToolCall => format!("[TOOL CALL: {name}]"),
        EntryType::ToolResult => format!("[TOOL RESULT: {name}] {}", text(TOOL_RESULT_CHARS)),
        EntryType::Plan => format!("[PLAN]:\n  {}", text(MESSAGE_CHARS)),
    }
}

/// The rendered entries kept so far, newest first, within the budget.
struct Lines<'a> {
    newest_first: Vec<String>,
    used: usize,
    budget: usize,
    newest_seq: Option<u64>,
    /// Entries at or below this seq are not taken (the agent has them).
    after: Option<u64>,
    /// Entries in these seq ranges (inclusive) are left out: rewound turns'.
    skip: &'a [(u64, u64)],
}

impl Lines<'_> {
    /// Takes one line of the history (newer lines were taken before it); `false` once the
    /// budget is spent and no older line can fit.
    fn take(&mut self, line: &[u8]) -> bool {
        if line.is_empty() {
            return true;
        }
        // A line that does not parse (a torn write that recovery cuts) is skipped.
        let Ok(entry) = serde_json::from_slice::<HistoryEntry>(line) else { return true };
        self.newest_seq.get_or_insert(entry.seq);
        if self.after.is_some_and(|after| entry.seq <= after) {
            return false;
        }
        if self.skip.iter().any(|(from, to)| (*from..=*to).contains(&entry.seq)) {
            return true;
        }
        let rendered = render(&entry);
        let cost = rendered.chars().count() + 1;
        if self.used + cost > self.budget {
            return false;
        }
        self.used += cost;
        self.newest_first.push(rendered);
        true
    }
}

/// How many seqs in `above + 1 ..= newest` the ranges of `skip` cover (they may overlap).
fn left_out(skip: &[(u64, u64)], above: u64, newest: u64) -> u64 {
    let mut ranges: Vec<(u64, u64)> = skip
        .iter()
        .map(|&(from, to)| (from.max(above + 1), to.min(newest)))
        .filter(|(from, to)| from <= to)
        .collect();
    ranges.sort_unstable();
    let (mut count, mut covered) = (0, above);
    for (from, to) in ranges {
        let from = from.max(covered + 1);
        if from <= to {
            count += to - from + 1;
            covered = to;
        }
    }
    count
}

/// Joins the pieces of one line (nearest the end first) in file order, and empties them.
fn join(pending: &mut Vec<Vec<u8>>) -> Vec<u8> {
    let mut line = Vec::with_capacity(pending.iter().map(Vec::len).sum());
    for piece in pending.drain(..).rev() {
        line.extend_from_slice(&piece);
    }
    line
}

/// Builds the resume context for `prompt` from the history in `file`, keeping the newest
/// entries that fit in `budget` characters.
pub fn build<F: Read + Seek>(
    file: &mut F,
    prompt: &str,
    budget: usize,
) -> io::Result<ResumeContext> {
    build_after(file, prompt, budget, (None, &[]), ("", ""))
}

/// [`build`] of the entries after seq `after` only (when given): what an agent's restored
/// conversation lacks; never those in the ranges of `skip` (rewound turns'). `sections` — `(head, tail)`, the state compiled from a snapshot (see
/// [`crate::snapshot::injected_sections`]) — go before and after the history; the history
/// gets what of `budget` they leave (the prompt is outside the budget, always whole).
pub fn build_after<F: Read + Seek>(
    file: &mut F,
    prompt: &str,
    budget: usize,
    (after, skip): (Option<u64>, &[(u64, u64)]),
    sections: (&str, &str),
) -> io::Result<ResumeContext> {
    let (head, tail) = sections;
    let budget = budget.saturating_sub(head.chars().count() + tail.chars().count());
    let len = file.seek(SeekFrom::End(0))?;
    let mut pos = len;
    let mut bytes_read = 0u64;
    // The pieces of the line whose start has not been reached yet, the piece nearest the
    // end of the file first. A line is joined once, when its start is found, so a huge entry
    // costs its own size, not its size times the number of chunks it spans.
    let mut pending: Vec<Vec<u8>> = Vec::new();
    let mut lines =
        Lines { newest_first: Vec::new(), used: 0, budget, newest_seq: None, after, skip };
    while pos > 0 {
        let step = pos.min(CHUNK);
        pos -= step;
        let mut chunk = vec![0u8; step as usize];
        file.seek(SeekFrom::Start(pos))?;
        file.read_exact(&mut chunk)?;
        bytes_read += step;
        let Some(last) = chunk.iter().rposition(|&b| b == b'\n') else {
            // No line starts in this chunk (unless the file does).
            pending.push(chunk);
            if pos == 0 && !lines.take(&join(&mut pending)) {
                break;
            }
            continue;
        };
        // The line the pending pieces end starts right after this chunk's last newline.
        pending.push(chunk[last + 1..].to_vec());
        if !lines.take(&join(&mut pending)) {
            break;
        }
        // Whole lines inside the chunk, newest first; the bytes before its first newline
        // are the end of a line that starts earlier (or, at the file's start, a line).
        let mut full = false;
        let mut segments = chunk[..last].rsplit(|&b| b == b'\n').peekable();
        while let Some(line) = segments.next() {
            let is_first = segments.peek().is_none();
            if is_first && pos > 0 {
                pending.push(line.to_vec());
                break;
            }
            if !lines.take(line) {
                full = true;
                break;
            }
        }
        if full {
            break;
        }
    }
    let Lines { newest_first: lines_newest_first, newest_seq, .. } = lines;
    let included = lines_newest_first.len();
    // Entries are numbered from 1 without gaps, so the newest seq is the total count.
    let omitted = newest_seq.map_or(0, |seq| {
        let above = after.unwrap_or(0);
        seq.saturating_sub(above)
            .saturating_sub(left_out(skip, above, seq))
            .saturating_sub(included as u64)
    });
    let mut text = String::from("RESUME CONTEXT FOR CONTINUING TASK\n");
    text.push_str(head);
    text.push_str(match after {
        None => "\n=== EXECUTION HISTORY ===\n",
        Some(_) => "\n=== EXECUTION HISTORY (the end your restored session lacks) ===\n",
    });
    if omitted > 0 {
        text.push_str(&format!("[{omitted} earlier entries omitted]\n"));
    }
    for line in lines_newest_first.iter().rev() {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str(tail);
    text.push_str("\n=== CURRENT REQUEST ===\n");
    text.push_str(prompt);
    text.push_str(
        "\n\n=== INSTRUCTIONS ===\nYou are continuing work on the above task. The execution history shows what was \
         already said and done.\nDo not repeat work that was already completed.\n",
    );
    Ok(ResumeContext { text, included, omitted, bytes_read })
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn entry(seq: u64, kind: EntryType, content: &str) -> String {
        let tool = matches!(kind, EntryType::ToolCall | EntryType::ToolResult);
        let entry = HistoryEntry {
            wire: protocol::api::HistoryEntry {
                seq,
                at: 0,
                kind,
                role: "x".into(),
                content: content.into(),
                tool_name: tool.then(|| "ls".into()),
                tool_call_id: tool.then(|| "c1".into()),
                tool_status: tool.then(|| "completed".into()),
                message_id: None,
                plan: None,
                rewound: false,
            },
            agent_seq: None,
            generation: None,
        };
        serde_json::to_string(&entry).unwrap() + "\n"
    }

    #[test]
    fn the_newest_plan_has_its_own_section_before_the_request() {
        let history = entry(1, EntryType::UserMessage, "list the files");
        let plan = [protocol::api::PlanEntry {
            content: "list them".into(),
            status: "in_progress".into(),
            priority: None,
        }];
        let (head, tail) = crate::snapshot::injected_sections(None, &plan, None, 10_000);
        let context =
            build_after(&mut Cursor::new(history), "go", 10_000, (None, &[]), (&head, &tail))
                .unwrap();
        assert!(
            context.text.contains(
                "[USER]: list the files\n\n=== PLAN (as the agent last gave it) ===\n[in progress] list them\n\n=== CURRENT REQUEST ===\ngo\n"
            ),
            "{}",
            context.text
        );
    }

    #[test]
    fn a_multi_line_entry_has_its_later_lines_indented_under_its_tag() {
        let history = [
            entry(1, EntryType::UserMessage, "first\n/sleep 30000\nthe long job"),
            entry(2, EntryType::AgentMessage, "done\n/write x"),
        ]
        .concat();
        let context = build(&mut Cursor::new(history.into_bytes()), "now", 10_000).unwrap();
        assert!(
            context.text.contains(
                "[USER]: first\n  /sleep 30000\n  the long job\n[ASSISTANT]: done\n  /write x\n"
            ),
            "{}",
            context.text
        );
        let history = context.text.split("=== CURRENT REQUEST ===").next().unwrap();
        assert!(!history.lines().any(|line| line.starts_with('/')), "{history}");
    }

    #[test]
    fn the_context_has_the_documented_shape() {
        let history = [
            entry(1, EntryType::UserMessage, "list the files"),
            entry(2, EntryType::ToolCall, "ls"),
            entry(3, EntryType::ToolResult, "a.txt\nb.txt"),
            entry(4, EntryType::AgentMessage, "there are two files"),
        ]
        .concat();
        let context = build(&mut Cursor::new(history), "and now?", 10_000).unwrap();
        assert_eq!(
            context.text,
            "RESUME CONTEXT FOR CONTINUING TASK\n\n=== EXECUTION HISTORY ===\n[USER]: list the files\n[TOOL CALL: ls]\n\
             [TOOL RESULT: ls] a.txt\n  b.txt\n[ASSISTANT]: there are two files\n\n=== CURRENT REQUEST ===\nand now?\n\n\
             === INSTRUCTIONS ===\nYou are continuing work on the above task. The execution history shows what was \
             already said and done.\nDo not repeat work that was already completed.\n"
        );
        assert_eq!((context.included, context.omitted), (4, 0));
    }

    #[test]
    fn long_texts_are_cut_on_character_boundaries() {
        let long_message = "é".repeat(3000);
        let long_result = "日".repeat(900);
        let history = [
            entry(1, EntryType::UserMessage, &long_message),
            entry(2, EntryType::ToolResult, &long_result),
        ]
        .concat();
        let context = build(&mut Cursor::new(history), "p", 100_000).unwrap();
        assert!(context.text.contains(&format!("[USER]: {}\n", "é".repeat(MESSAGE_CHARS))));
        assert!(
            context
                .text
                .contains(&format!("[TOOL RESULT: ls] {}\n", "日".repeat(TOOL_RESULT_CHARS)))
        );
        assert!(!context.text.contains(&"é".repeat(MESSAGE_CHARS + 1)));
    }

    #[test]
    fn the_budget_keeps_the_newest_entries_and_counts_the_rest() {
        let history: String = (1..=100)
            .map(|n| entry(n, EntryType::UserMessage, &format!("message {n:03}")))
            .collect();
        let context = build(&mut Cursor::new(history), "p", 200).unwrap();
        assert!(context.included > 0 && context.included < 100);
        assert_eq!(context.omitted, 100 - context.included as u64);
        assert!(context.text.contains("message 100"));
        assert!(!context.text.contains("message 001"));
        assert!(context.text.contains(&format!("[{} earlier entries omitted]", context.omitted)));
    }

    /// Entries much larger than the read step (several chunks each, the newest too) come
    /// out whole and in order; the budget counts their rendered excerpt, not their size.
    #[test]
    fn entries_larger_than_the_read_step_are_read_whole() {
        let big = |c: char| c.to_string().repeat(3 * CHUNK as usize + 17);
        let history = [
            entry(1, EntryType::UserMessage, "small first"),
            entry(2, EntryType::AgentMessage, &big('a')),
            entry(3, EntryType::UserMessage, "small middle"),
            entry(4, EntryType::ToolResult, &big('t')),
            entry(5, EntryType::AgentMessage, &big('z')),
        ]
        .concat();
        let context = build(&mut Cursor::new(history.clone()), "p", 100_000).unwrap();
        assert_eq!((context.included, context.omitted), (5, 0));
        let order = [
            "[USER]: small first",
            "[ASSISTANT]: aaa",
            "[USER]: small middle",
            "[TOOL RESULT: ls] ttt",
            "[ASSISTANT]: zzz",
        ];
        let mut rest = context.text.as_str();
        for part in order {
            let at = rest.find(part).unwrap_or_else(|| panic!("{part} in order"));
            rest = &rest[at + part.len()..];
        }
        assert!(context.text.contains(&format!("[ASSISTANT]: {}\n", "z".repeat(MESSAGE_CHARS))));
        assert_eq!(context.bytes_read, history.len() as u64);
        // A budget for the newest entry alone keeps just it.
        let context = build(&mut Cursor::new(history), "p", MESSAGE_CHARS + 20).unwrap();
        assert_eq!((context.included, context.omitted), (1, 4));
    }

    #[test]
    fn a_huge_history_costs_only_what_the_budget_needs() {
        // A 1 GiB file is simulated by a reader that fabricates lines on demand, so the test
        // counts bytes read instead of allocating a gibibyte.
        struct Huge {
            len: u64,
            pos: u64,
        }
        const LINE: &[u8] = b"{\"seq\":1,\"at\":0,\"type\":\"user_message\",\"role\":\"user\",\"content\":\"filler text filler text\"}\n";
        impl Read for Huge {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = (buf.len() as u64).min(self.len - self.pos) as usize;
                for (i, byte) in buf[..n].iter_mut().enumerate() {
                    *byte = LINE[((self.pos + i as u64) % LINE.len() as u64) as usize];
                }
                self.pos += n as u64;
                Ok(n)
            }
        }
        impl Seek for Huge {
            fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
                self.pos = match to {
                    SeekFrom::Start(n) => n,
                    SeekFrom::End(n) => (self.len as i64 + n) as u64,
                    SeekFrom::Current(n) => (self.pos as i64 + n) as u64,
                };
                Ok(self.pos)
            }
        }
        let len = (1u64 << 30) / LINE.len() as u64 * LINE.len() as u64;
        let context = build(&mut Huge { len, pos: 0 }, "p", 10_000).unwrap();
        assert!(context.included > 100);
        assert!(
            context.bytes_read <= 2 * CHUNK,
            "read {} bytes of a 1 GiB history",
            context.bytes_read
        );
    }
}
