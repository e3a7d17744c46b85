//! Conversation history: one JSONL file per session (`sessions/<id>/history.jsonl`), one
//! writer (the session's actor), one entry per line:
//! `{seq, at, type, role, content, tool_name, tool_call_id, tool_status}`.
//!
//! Agent text arrives as many chunks; it is coalesced into one `agent_message` entry per
//! message, written at the message boundary (a tool call, the end of the turn, the next
//! user message). A tool call announced `pending` waits in memory too, until the agent
//! names it (its first title may be a placeholder). A torn last line — the supervisor
//! killed mid-write — is cut off when the file is opened, so every line that remains is
//! whole.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The most characters of a tool result kept in the history.
pub const TOOL_RESULT_EXCERPT_CHARS: usize = 2000;

pub use protocol::api::EntryType;

/// What ends a reply cut off by its failed turn, before the reason and a `]`: Tether's
/// note, not the agent's text (a reader comparing the history with the stream drops it).
pub const CUT_OFF: &str = "\n\n[the reply was cut off here: ";

/// A history entry's text without Tether's cut-off notes ([`CUT_OFF`], a reason, `]`):
/// what the agent itself said, to hold against what an agent or a stream has of it.
pub fn without_cut_off_notes(content: &str) -> String {
    let mut text = content.to_owned();
    let mut from = 0;
    while let Some(at) = text[from..].find(CUT_OFF).map(|at| from + at) {
        match text[at + CUT_OFF.len()..].find(']') {
            Some(end) => text.replace_range(at..at + CUT_OFF.len() + end + 1, ""),
            None => break,
        }
        from = at;
    }
    text
}

/// One history line: the entry as the API serves it, and the marks around it that are the
/// history's own (they never leave the daemon).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// The entry (`seq`, `at`, `type`, `role`, `content`, the tool's fields).
    #[serde(flatten)]
    pub wire: protocol::api::HistoryEntry,
    /// The newest agentctl event seq folded into the history when this entry was written.
    /// After a restart, events at or below it are not recorded again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_seq: Option<u64>,
    /// The execution (its generation) whose events `agent_seq` counts: a mark means
    /// nothing for another execution, whose agentctl numbers its events from 1 again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

impl std::ops::Deref for HistoryEntry {
    type Target = protocol::api::HistoryEntry;

    fn deref(&self) -> &protocol::api::HistoryEntry {
        &self.wire
    }
}

/// Whether a mark written for `written` counts for the execution of `generation`. Entries
/// from before generations were written (`None`) are trusted, as they were then.
pub fn same_execution(written: Option<i64>, generation: i64) -> bool {
    written.is_none_or(|written| written == generation)
}

/// A tool call the agent announced `pending`: its input may still be streaming, and its
/// title be a placeholder ("Preparing file…") that a later update replaces. Its entry is
/// written once the agent names it or starts it, or before any later entry.
#[derive(Debug)]
struct HeldToolCall {
    title: String,
    id: String,
    status: String,
    /// The agentctl seq of its announcement, and the execution that sent it: its entry
    /// carries them, whenever it is written (see [`History::unflushed_since`]).
    mark: Option<u64>,
    generation: Option<i64>,
}

/// The writer of one session's history.
#[derive(Debug)]
pub struct History {
    path: PathBuf,
    /// Entries were written since the last [`History::sync`]. The file is not kept open:
    /// each entry is appended through a handle of its own (entries are whole messages, not
    /// chunks), so a session holds no descriptor for its history.
    unsynced: bool,
    next_seq: u64,
    /// Agent text not yet written (the current message).
    agent_text: String,
    /// The agent's id of its current message (ACP `messageId`), when it gave one: kept
    /// after a flush, as the rest of a long message is written in entries of its own.
    agent_message_id: Option<String>,
    /// The newest agentctl event seq handled; written into each entry.
    watermark: Option<u64>,
    /// The agentctl seq of the first chunk of `agent_text`: from there on, nothing of the
    /// current message is on disk yet.
    unflushed_since: Option<u64>,
    /// The agentctl seq of the last chunk of `agent_text`: the message's entry carries it
    /// (not the seq of the event that ended the message, whose own entry may follow and
    /// must not be skipped by a replay if a kill falls between the two).
    last_chunk: Option<u64>,
    /// The file's length after its last whole line.
    len: u64,
    /// The execution whose events are being recorded (written into each entry).
    generation: Option<i64>,
    /// The execution whose agentctl count `watermark` is in: each agentctl counts from 1,
    /// so a seq means nothing without it.
    watermark_generation: Option<i64>,
    /// The execution whose events `agent_text` holds (an entry carries its own message's
    /// execution even when it is flushed after the next one began).
    text_generation: Option<i64>,
    /// The execution of the newest entry on disk.
    last_generation: Option<i64>,
    /// The agent's text since the last entry that was not an agent message: the final
    /// message so far (a long one is written in several entries).
    tail_message: String,
    /// Tool calls announced `pending`, not written yet, oldest first; all of them came
    /// before `agent_text` (announcing one writes the message before it).
    held_tools: std::collections::VecDeque<HeldToolCall>,
}

impl History {
    /// Opens (creating, 0600) the history file, repairing a torn last line.
    pub fn open(path: &Path) -> io::Result<History> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        let last = repair_tail(&mut file)?
            .and_then(|line| serde_json::from_slice::<HistoryEntry>(&line).ok());
        let next_seq = last.as_ref().map_or(1, |entry| entry.seq + 1);
        let tail_message = last
            .as_ref()
            .filter(|entry| entry.kind == EntryType::AgentMessage)
            .map(|entry| entry.content.clone())
            .unwrap_or_default();
        let last_generation = last.as_ref().and_then(|entry| entry.generation);
        let watermark = last.and_then(|entry| entry.agent_seq);
        let len = file.seek(SeekFrom::End(0))?;
        drop(file);
        Ok(History {
            path: path.to_owned(),
            unsynced: false,
            next_seq,
            agent_text: String::new(),
            agent_message_id: None,
            watermark,
            unflushed_since: None,
            last_chunk: None,
            len,
            generation: None,
            watermark_generation: last_generation,
            text_generation: None,
            last_generation,
            tail_message,
            held_tools: std::collections::VecDeque::new(),
        })
    }

    /// Whether something waits in memory (a held tool call, the message being coalesced)
    /// that came from an execution other than `generation`'s: no replay of that one brings
    /// it back.
    pub fn holds_unwritten_beside(&self, generation: Option<i64>) -> bool {
        let text = (!self.agent_text.is_empty()).then_some(self.text_generation);
        let held = self.held_tools.iter().map(|call| call.generation);
        text.into_iter().chain(held).any(|of| of != generation)
    }

    /// Takes over what `from` holds only in memory (the held tool calls and the message
    /// being coalesced, with their marks), leaving it nothing to write: for a history
    /// opened again when no replay will bring that back (its sidecar is gone).
    pub fn take_unwritten(&mut self, from: &mut History) {
        self.agent_text = std::mem::take(&mut from.agent_text);
        self.agent_message_id = from.agent_message_id.take();
        self.unflushed_since = from.unflushed_since.take();
        self.last_chunk = from.last_chunk.take();
        self.text_generation = from.text_generation.take();
        self.held_tools = std::mem::take(&mut from.held_tools);
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends an entry (flushing pending agent text first) and returns its seq.
    pub fn append(
        &mut self,
        kind: EntryType,
        content: String,
        tool: Option<(String, String, String)>,
    ) -> io::Result<u64> {
        self.flush_agent()?;
        self.write(kind, content, tool, None).map_err(|(err, _)| err)
    }

    /// Appends the agent's plan (flushing pending agent text first) and returns its seq.
    pub fn append_plan(&mut self, plan: Vec<protocol::api::PlanEntry>) -> io::Result<u64> {
        self.flush_agent()?;
        let content = protocol::api::PlanEntry::lines(&plan);
        self.write_entry(EntryType::Plan, content, None, None, Some(plan)).map_err(|(err, _)| err)
    }

    /// Appends a user message with its id (its turn's), flushing pending agent text first,
    /// and returns its seq.
    pub fn append_prompt(&mut self, content: String, message_id: String) -> io::Result<u64> {
        self.flush_agent()?;
        self.agent_message_id = None;
        self.write(EntryType::UserMessage, content, None, Some(message_id)).map_err(|(err, _)| err)
    }

    /// The newest agentctl event seq the file reflects (from its last entry when opened).
    pub fn watermark(&self) -> Option<u64> {
        self.watermark
    }

    /// The mark to trust for the execution of `generation`: the newest entry's agentctl seq
    /// if that entry was written for it, else 0 (nothing of it recorded yet).
    pub fn mark_for(&self, generation: i64) -> u64 {
        if same_execution(self.last_generation, generation) {
            self.watermark.unwrap_or(0)
        } else {
            0
        }
    }

    /// The execution whose events are recorded from now on. A mark of another execution's
    /// count is not carried over: until an event of this one is handled, entries say that
    /// nothing of it is reflected yet (0).
    pub fn set_generation(&mut self, generation: i64) {
        self.generation = Some(generation);
        if !same_execution(self.watermark_generation, generation) {
            self.watermark = Some(0);
            self.watermark_generation = Some(generation);
        }
    }

    /// Records that agentctl event `seq` (of the current execution) is being handled.
    pub fn set_watermark(&mut self, seq: u64) {
        self.watermark = Some(seq);
        self.watermark_generation = self.generation;
    }

    /// Whether any entry has been written.
    pub fn is_empty(&self) -> bool {
        self.next_seq == 1
    }

    /// Forces what was written to disk (before an ack).
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced {
            // A new handle flushes what the closed ones wrote (the file's data, not a
            // handle's).
            std::fs::File::open(&self.path)?.sync_data()?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Whether a chunk of `message_id` starts another message than the one being
    /// coalesced (which is then to be flushed first: an entry is one message).
    pub fn is_new_message(&self, message_id: Option<&str>) -> bool {
        !self.agent_text.is_empty()
            && message_id.is_some()
            && self.agent_message_id.as_deref() != message_id
    }

    /// Adds a chunk of agent text (of the agent's message `message_id`, when it said) to
    /// the current message.
    pub fn agent_chunk(&mut self, text: &str, message_id: Option<&str>) {
        if let Some(id) = message_id
            && self.agent_message_id.as_deref() != Some(id)
        {
            self.agent_message_id = Some(id.to_owned());
        }
        if self.agent_text.is_empty() {
            self.unflushed_since = self.watermark;
            self.text_generation = self.generation;
        } else {
            agentctl::fault::point("history.mid_message");
        }
        self.last_chunk = self.watermark;
        self.agent_text.push_str(text);
    }

    /// Marks the message being coalesced, if any, as cut off (its turn failed): one line
    /// after its text says so, so that whoever reads it — a person, the next agent given
    /// the history — does not take it for a whole reply.
    pub fn mark_cut(&mut self, why: &str) {
        if self.agent_text.is_empty() {
            return;
        }
        self.agent_text.push_str(&format!("{CUT_OFF}{why}]"));
    }

    /// The agent's final message so far: its text since the last entry that was not an
    /// agent message, written or not (a turn's output, once the turn ended).
    pub fn final_message(&self) -> String {
        format!("{}{}", self.tail_message, self.agent_text)
    }

    /// The bytes of the message being coalesced.
    pub fn coalesced_bytes(&self) -> usize {
        self.agent_text.len()
    }

    /// The agentctl seq from which what the agent said is still only in memory (a held
    /// tool call, the message being coalesced), if anything is.
    pub fn unflushed_since(&self) -> Option<u64> {
        let text = if self.agent_text.is_empty() { None } else { self.unflushed_since };
        let held = self.held_tools.front().and_then(|call| call.mark);
        held.into_iter().chain(text).min()
    }

    /// Holds a tool call the agent announced `pending` until [`History::name_tool_call`]
    /// or the next entry writes it. The message before it ends here, and is written (after
    /// the calls held before it); calls announced together stay held together.
    pub fn hold_tool_call(&mut self, title: String, id: String, status: String) -> io::Result<()> {
        if !self.agent_text.is_empty() {
            self.flush_agent()?;
        }
        let (mark, generation) = (self.watermark, self.generation);
        self.held_tools.push_back(HeldToolCall { title, id, status, mark, generation });
        Ok(())
    }

    /// The agent named or started tool call `id`: if it is held, it is written now under
    /// `title` (the newest the agent gave), after the calls held before it.
    pub fn name_tool_call(&mut self, id: &str, title: &str) -> io::Result<()> {
        let Some(idx) = self.held_tools.iter().position(|call| call.id == id) else {
            return Ok(());
        };
        title.clone_into(&mut self.held_tools[idx].title);
        self.write_held(idx + 1)
    }

    /// Writes the first `count` held tool calls, each with its own announcement's mark: a
    /// later event's mark would claim the text coalescing after it is on disk.
    fn write_held(&mut self, count: usize) -> io::Result<()> {
        for _ in 0..count {
            let Some(call) = self.held_tools.pop_front() else { break };
            let current = (self.watermark, self.generation);
            (self.watermark, self.generation) = (call.mark, call.generation);
            let tool = (call.title.clone(), call.id.clone(), call.status.clone());
            let written = self.write(EntryType::ToolCall, call.title.clone(), Some(tool), None);
            (self.watermark, self.generation) = current;
            if let Err((err, _)) = written {
                // Kept (and not acknowledged): a later write tries again.
                self.held_tools.push_front(call);
                return Err(err);
            }
        }
        Ok(())
    }

    /// Writes what waits in memory: the held tool calls, then the current agent message,
    /// if any (whose seq it returns).
    pub fn flush_agent(&mut self) -> io::Result<Option<u64>> {
        self.write_held(self.held_tools.len())?;
        if self.agent_text.is_empty() {
            return Ok(None);
        }
        let text = std::mem::take(&mut self.agent_text);
        // The entry carries its last chunk's seq and execution, not those of the event
        // that ended the message.
        let current = (self.watermark, self.generation);
        self.watermark = self.last_chunk.or(current.0);
        self.generation = self.text_generation.or(current.1);
        let id = self.agent_message_id.clone();
        let written = self.write(EntryType::AgentMessage, text, None, id);
        (self.watermark, self.generation) = current;
        match written {
            Ok(seq) => {
                self.unflushed_since = None;
                Ok(Some(seq))
            }
            Err((err, text)) => {
                // Kept in memory (and not acknowledged): a later flush tries again.
                self.agent_text = text;
                Err(err)
            }
        }
    }

    fn write(
        &mut self,
        kind: EntryType,
        content: String,
        tool: Option<(String, String, String)>,
        message_id: Option<String>,
    ) -> Result<u64, (io::Error, String)> {
        self.write_entry(kind, content, tool, message_id, None)
    }

    fn write_entry(
        &mut self,
        kind: EntryType,
        content: String,
        tool: Option<(String, String, String)>,
        message_id: Option<String>,
        plan: Option<Vec<protocol::api::PlanEntry>>,
    ) -> Result<u64, (io::Error, String)> {
        let seq = self.next_seq;
        let role = match kind {
            EntryType::UserMessage => "user",
            EntryType::AgentMessage | EntryType::Plan => "assistant",
            EntryType::ToolCall | EntryType::ToolResult => "tool",
        };
        let (tool_name, tool_call_id, tool_status) = match tool {
            Some((name, id, status)) => (Some(name), Some(id), Some(status)),
            None => (None, None, None),
        };
        let wire = protocol::api::HistoryEntry {
            seq,
            at: crate::store::now_ms(),
            kind,
            role: role.into(),
            content,
            tool_name,
            tool_call_id,
            tool_status,
            message_id,
            plan,
            rewound: false,
        };
        let entry = HistoryEntry { wire, agent_seq: self.watermark, generation: self.generation };
        let mut line = serde_json::to_vec(&entry).expect("UNWRAP: entries always serialise");
        line.push(b'\n');
        let mut file = match std::fs::OpenOptions::new().read(true).append(true).open(&self.path) {
            Ok(file) => file,
            Err(err) => return Err((err, entry.wire.content)),
        };
        let len = match self.end_a_torn_tail(&file, &mut line) {
            Ok(len) => len,
            Err(err) => return Err((err, entry.wire.content)),
        };
        self.unsynced = true;
        if let Err(err) = file.write_all(&line) {
            // A short write (a full disk) must not leave half a line for the next one to
            // be glued to.
            if let Err(cut) = file.set_len(len) {
                tracing::error!(%cut, path = %self.path.display(), "cannot cut a torn history line");
            }
            return Err((err, entry.wire.content));
        }
        self.len = len + line.len() as u64;
        self.next_seq += 1;
        if kind == EntryType::AgentMessage {
            self.tail_message.push_str(&entry.wire.content);
        } else {
            self.tail_message.clear();
        }
        self.last_generation = self.generation;
        Ok(seq)
    }
}

impl History {
    /// Makes sure `line` starts a line of its own: when the file is not as this writer
    /// left it (cut, or written by another hand) and ends without a newline, `line` is
    /// given one in front, so what the file ends in is one damaged line (readers skip and
    /// report it) and the entry is whole — never glued to it. Returns the file's length.
    fn end_a_torn_tail(&self, file: &std::fs::File, line: &mut Vec<u8>) -> io::Result<u64> {
        use std::os::unix::fs::FileExt;
        let len = file.metadata()?.len();
        if len == self.len {
            return Ok(len);
        }
        let mut last = [0u8];
        if len > 0 {
            file.read_exact_at(&mut last, len - 1)?;
        }
        if len > 0 && last[0] != b'\n' {
            tracing::warn!(
                path = %self.path.display(),
                "the history ends in a torn line (cut, or written by another hand): it is ended \
                 there, and read as a damaged line"
            );
            line.insert(0, b'\n');
        } else {
            tracing::warn!(path = %self.path.display(), len, expected = self.len, "the history was changed by another hand");
        }
        Ok(len)
    }
}

/// Cuts a torn last line off and returns the last whole line, reading backwards in bounded
/// chunks (cost bounded by the line length, not the file size).
fn repair_tail(file: &mut std::fs::File) -> io::Result<Option<Vec<u8>>> {
    let len = file.seek(SeekFrom::End(0))?;
    if len == 0 {
        return Ok(None);
    }
    let end = match rfind_newline(file, len)? {
        Some(newline) => newline + 1,
        None => {
            tracing::warn!(dropped = len, "repairing a history file with no complete line");
            file.set_len(0)?;
            return Ok(None);
        }
    };
    if end < len {
        tracing::warn!(dropped = len - end, "repairing a torn last history line");
        file.set_len(end)?;
    }
    let start = rfind_newline(file, end - 1)?.map_or(0, |newline| newline + 1);
    let mut line = vec![0u8; (end - 1 - start) as usize];
    file.seek(SeekFrom::Start(start))?;
    file.read_exact(&mut line)?;
    file.seek(SeekFrom::End(0))?;
    Ok(Some(line))
}

/// The position of the last `\n` before byte `before`.
fn rfind_newline(file: &mut std::fs::File, before: u64) -> io::Result<Option<u64>> {
    let mut pos = before;
    while pos > 0 {
        let step = pos.min(64 * 1024);
        pos -= step;
        let mut chunk = vec![0u8; step as usize];
        file.seek(SeekFrom::Start(pos))?;
        file.read_exact(&mut chunk)?;
        if let Some(idx) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(pos + idx as u64));
        }
    }
    Ok(None)
}

/// A history line that is not an entry (a bad byte, a garbled write), skipped and reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedLine {
    /// From 1.
    pub line: usize,
    /// Why it is not an entry.
    pub reason: String,
}

/// Entries read from a history, and the damaged lines skipped among them.
#[derive(Debug, Default)]
pub struct HistoryRead {
    pub entries: Vec<HistoryEntry>,
    pub damaged: Vec<DamagedLine>,
}

/// Reads entries with `seq > after_seq`, at most `limit`, line by line: a damaged line (not
/// JSON, not UTF-8, not an entry) is skipped and reported, the rest kept; an unfinished last
/// line (being written; the writer repairs it on open) is skipped silently. A missing file
/// is empty.
pub fn read(path: &Path, after_seq: u64, limit: usize) -> io::Result<HistoryRead> {
    use std::io::BufRead;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(HistoryRead::default()),
        Err(err) => return Err(err),
    };
    let mut read = HistoryRead::default();
    let mut reader = io::BufReader::new(file);
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let finished = line.ends_with(b"\n");
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let entry = match serde_json::from_slice::<HistoryEntry>(text) {
            Ok(entry) => entry,
            Err(_) if !finished => break,
            Err(err) => {
                let reason = match std::str::from_utf8(text) {
                    Err(bad) => format!("not UTF-8 (byte {})", bad.valid_up_to() + 1),
                    Ok(_) => err.to_string(),
                };
                read.damaged.push(DamagedLine { line: number, reason });
                continue;
            }
        };
        if entry.seq > after_seq {
            read.entries.push(entry);
            if read.entries.len() >= limit {
                break;
            }
        }
    }
    Ok(read)
}

/// The most bytes [`last_plan`] reads back from the end of a history.
pub const PLAN_SEARCH_BYTES: u64 = 64 << 20;

/// The agent's newest plan in a history file and when it gave it: read backwards from the
/// end (a megabyte at a time, up to [`PLAN_SEARCH_BYTES`]) to the last plan entry, whose
/// `"type":"plan"` member no other entry's text can hold (its quotes would be escaped).
/// `None`: no plan in that reach, or the file cannot be read.
pub fn last_plan(path: &Path) -> Option<(i64, Vec<protocol::api::PlanEntry>)> {
    const STEP: u64 = 1 << 20;
    let marker = memchr::memmem::FinderRev::new(br#""type":"plan""#);
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.seek(SeekFrom::End(0)).ok()?;
    let floor = len.saturating_sub(PLAN_SEARCH_BYTES);
    let (mut pos, mut window) = (len, Vec::new());
    loop {
        // `window` holds the file from `pos` on, up to the start of a line already searched.
        let mut end = window.len();
        while let Some(at) = marker.rfind(&window[..end]) {
            let start = memchr::memrchr(b'\n', &window[..at]).map(|nl| nl + 1);
            let Some(start) = start.or((pos == 0).then_some(0)) else { break };
            let stop = memchr::memchr(b'\n', &window[at..]).map_or(window.len(), |nl| at + nl);
            if let Ok(entry) = serde_json::from_slice::<HistoryEntry>(&window[start..stop])
                && entry.kind == EntryType::Plan
            {
                return Some((entry.at, entry.wire.plan.unwrap_or_default()));
            }
            end = start;
        }
        if pos <= floor {
            return None;
        }
        // Every line after the window's first newline was searched (a marker never spans
        // lines); the one it starts in continues before `pos`: keep it, read before it.
        window.truncate(memchr::memchr(b'\n', &window[..end]).map_or(end, |nl| nl + 1));
        let step = STEP.min(pos - floor);
        pos -= step;
        let mut chunk = vec![0u8; step as usize];
        file.seek(SeekFrom::Start(pos)).ok()?;
        file.read_exact(&mut chunk).ok()?;
        chunk.extend_from_slice(&window);
        window = chunk;
    }
}

/// The whole lines of the last `max` bytes of a history file (a line cut by the start of
/// the window, and any that do not parse, are left out).
pub fn read_tail(path: &Path, max: u64) -> Vec<HistoryEntry> {
    let Ok(mut file) = std::fs::File::open(path) else { return Vec::new() };
    let Ok(len) = file.seek(SeekFrom::End(0)) else { return Vec::new() };
    let start = len.saturating_sub(max);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let mut lines = bytes.split(|&b| b == b'\n');
    if start > 0 {
        lines.next();
    }
    lines.filter_map(|line| serde_json::from_slice(line).ok()).collect()
}

/// The last `max` characters of `text`, cut on a character boundary.
pub fn excerpt_tail(text: &str, max: usize) -> String {
    let count = text.chars().count();
    match text.char_indices().nth(count.saturating_sub(max)) {
        Some((idx, _)) => text[idx..].to_owned(),
        None => String::new(),
    }
}

/// Cuts `text` to at most `max` characters, on a character boundary.
pub fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((idx, _)) => text[..idx].to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(steps: &[(&str, &str)]) -> Vec<protocol::api::PlanEntry> {
        let entry = |(content, status): &(&str, &str)| protocol::api::PlanEntry {
            content: (*content).into(),
            status: (*status).into(),
            priority: None,
        };
        steps.iter().map(entry).collect()
    }

    /// The newest plan is found however far back it is (its line read across the
    /// megabyte steps), a message that only talks about plans is not one, and a history
    /// without a plan has none.
    #[test]
    fn the_newest_plan_is_found_across_read_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut history = History::open(&path).unwrap();
        history.append(EntryType::UserMessage, "start".into(), None).unwrap();
        assert_eq!(last_plan(&path), None, "no plan yet");
        let old = plan(&[("old step", "pending")]);
        history.append_plan(old).unwrap();
        let newest = plan(&[("first", "completed"), ("second", "in_progress")]);
        history.append_plan(newest.clone()).unwrap();
        let written = read(&path, 0, 100).unwrap().entries;
        let at = written.last().unwrap().at;
        assert_eq!(written.last().unwrap().content, "[done] first\n[in progress] second");
        // About 3 MiB after it, with a message that quotes a plan entry's JSON.
        history.append(EntryType::AgentMessage, r#"{"type":"plan"}"#.into(), None).unwrap();
        for n in 0..3_000 {
            let filler = format!("{n} {}", "x".repeat(1_000 + n % 7));
            history.append(EntryType::AgentMessage, filler, None).unwrap();
        }
        assert!(std::fs::metadata(&path).unwrap().len() > 3 << 20);
        assert_eq!(last_plan(&path), Some((at, newest)));
        // A huge plan line spanning steps is read whole.
        let long = plan(&[(&"y".repeat(3 << 20), "pending")]);
        let seq = history.append_plan(long.clone()).unwrap();
        history.append(EntryType::AgentMessage, "after".into(), None).unwrap();
        let at = read(&path, seq - 1, 1).unwrap().entries[0].at;
        assert_eq!(last_plan(&path), Some((at, long)));
        assert_eq!(last_plan(&dir.path().join("missing.jsonl")), None);
    }

    #[test]
    fn chunks_coalesce_at_message_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut history = History::open(&path).unwrap();
        history.append(EntryType::UserMessage, "hi".into(), None).unwrap();
        history.agent_chunk("hel", None);
        history.agent_chunk("lo", None);
        history
            .append(
                EntryType::ToolCall,
                "ls".into(),
                Some(("ls".into(), "c1".into(), "pending".into())),
            )
            .unwrap();
        history.agent_chunk("done", None);
        history.flush_agent().unwrap();
        assert_eq!(history.flush_agent().unwrap(), None);
        let entries = read(&path, 0, 100).unwrap().entries;
        let summary: Vec<(u64, EntryType, &str)> =
            entries.iter().map(|e| (e.seq, e.kind, e.content.as_str())).collect();
        assert_eq!(
            summary,
            [
                (1, EntryType::UserMessage, "hi"),
                (2, EntryType::AgentMessage, "hello"),
                (3, EntryType::ToolCall, "ls"),
                (4, EntryType::AgentMessage, "done")
            ]
        );
        assert_eq!(read(&path, 2, 1).unwrap().entries[0].seq, 3);
    }

    /// A tool call announced `pending` is written under the title the agent names it by
    /// (claude's first is a placeholder), calls announced together are named one by one,
    /// and one never named is written as it is before the next entry.
    #[test]
    fn a_held_tool_call_is_written_under_the_title_it_is_named_by() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut history = History::open(&path).unwrap();
        let hold = |history: &mut History, id: &str| {
            history.hold_tool_call("Preparing file…".into(), id.into(), "pending".into())
        };
        history.agent_chunk("let me edit", None);
        hold(&mut history, "a").unwrap();
        hold(&mut history, "b").unwrap();
        history.name_tool_call("a", "Edit a.txt").unwrap();
        history.name_tool_call("b", "Edit b.txt").unwrap();
        history.name_tool_call("b", "Edit b.rs").unwrap();
        hold(&mut history, "c").unwrap();
        history.append(EntryType::ToolResult, "done".into(), None).unwrap();
        let entries = read(&path, 0, 100).unwrap().entries;
        let summary: Vec<(EntryType, &str, Option<&str>)> =
            entries.iter().map(|e| (e.kind, e.content.as_str(), e.tool_name.as_deref())).collect();
        assert_eq!(
            summary,
            [
                (EntryType::AgentMessage, "let me edit", None),
                (EntryType::ToolCall, "Edit a.txt", Some("Edit a.txt")),
                (EntryType::ToolCall, "Edit b.txt", Some("Edit b.txt")),
                (EntryType::ToolCall, "Preparing file…", Some("Preparing file…")),
                (EntryType::ToolResult, "done", None),
            ]
        );
        assert_eq!(entries[1].tool_call_id.as_deref(), Some("a"));
        assert_eq!(entries[3].tool_status.as_deref(), Some("pending"));
    }

    /// A held tool call holds the ack point back as a coalescing message does, and its
    /// entry carries its announcement's mark: not a later event's, which would claim the
    /// text coalescing after it is on disk.
    #[test]
    fn a_held_tool_call_is_unflushed_and_written_with_its_own_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut history = History::open(&path).unwrap();
        history.set_generation(1);
        history.set_watermark(10);
        history.hold_tool_call("Preparing file…".into(), "a".into(), "pending".into()).unwrap();
        assert_eq!(history.unflushed_since(), Some(10));
        history.set_watermark(11);
        history.agent_chunk("meanwhile", None);
        assert_eq!(history.unflushed_since(), Some(10), "the oldest of both");
        history.set_watermark(12);
        history.name_tool_call("a", "Edit a.txt").unwrap();
        assert_eq!(history.unflushed_since(), Some(11), "only the message is left");
        history.flush_agent().unwrap();
        assert_eq!(history.unflushed_since(), None);
        history.name_tool_call("a", "again").unwrap();
        let entries = read(&path, 0, 100).unwrap().entries;
        let marks: Vec<(&str, Option<u64>)> =
            entries.iter().map(|e| (e.content.as_str(), e.agent_seq)).collect();
        assert_eq!(marks, [("Edit a.txt", Some(10)), ("meanwhile", Some(11))]);
    }

    /// An entry is one message: a chunk of another `messageId` starts a new entry, each
    /// carries its message's id (a long one's later entries too), a prompt its turn's.
    #[test]
    fn message_ids_split_messages_and_are_written_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut history = History::open(&path).unwrap();
        history.append_prompt("hi".into(), "turn-1".into()).unwrap();
        for (text, id) in [("one ", "a"), ("two", "a"), ("three", "b")] {
            if history.is_new_message(Some(id)) {
                history.flush_agent().unwrap();
            }
            history.agent_chunk(text, Some(id));
        }
        assert!(!history.is_new_message(Some("b")));
        assert!(!history.is_new_message(None), "a chunk without an id goes on");
        history.flush_agent().unwrap();
        // The rest of b, after a flush (a long message, a tool call between).
        history.agent_chunk(" more", Some("b"));
        history.flush_agent().unwrap();
        let entries = read(&path, 0, 100).unwrap().entries;
        let summary: Vec<(&str, &str, Option<&str>)> = entries
            .iter()
            .map(|e| (e.role.as_str(), e.content.as_str(), e.message_id.as_deref()))
            .collect();
        assert_eq!(
            summary,
            [
                ("user", "hi", Some("turn-1")),
                ("assistant", "one two", Some("a")),
                ("assistant", "three", Some("b")),
                ("assistant", " more", Some("b"))
            ]
        );
        // A prompt ends the agent's message: its next one without an id has none.
        history.append_prompt("again".into(), "turn-2".into()).unwrap();
        history.agent_chunk("plain", None);
        history.flush_agent().unwrap();
        let last = read(&path, 5, 1).unwrap().entries;
        assert_eq!(last[0].message_id, None, "{last:?}");
    }

    #[test]
    fn a_damaged_line_is_skipped_and_reported_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut history = History::open(&path).unwrap();
        for text in ["one", "two", "three"] {
            history.append(EntryType::UserMessage, text.into(), None).unwrap();
        }
        drop(history);
        let text = std::fs::read(&path).unwrap();
        let mut lines: Vec<Vec<u8>> =
            text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect();
        // Line 2 gets a byte that is not UTF-8; a garbage line goes after line 3; and an
        // unfinished last line is being written.
        lines[1][10] = 0xff;
        lines.push(b"{not json".to_vec());
        let mut damaged = lines.join(&b'\n');
        damaged.extend_from_slice(b"\n{\"seq\": 9, \"at");
        std::fs::write(&path, damaged).unwrap();
        let read = read(&path, 0, 100).unwrap();
        let contents: Vec<&str> = read.entries.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(contents, ["one", "three"]);
        assert_eq!(read.damaged.len(), 2, "{:?}", read.damaged);
        assert_eq!(read.damaged[0], DamagedLine { line: 2, reason: "not UTF-8 (byte 11)".into() });
        assert_eq!(read.damaged[1].line, 4);
        assert!(read.damaged[1].reason.contains("key must be a string"), "{:?}", read.damaged);
    }

    #[test]
    fn marks_are_counted_per_execution() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        {
            let mut history = History::open(&path).unwrap();
            history.set_generation(1);
            history.set_watermark(300);
            history.append(EntryType::UserMessage, "one".into(), None).unwrap();
            history.set_watermark(305);
            history.agent_chunk("left over", None);
        }
        let mut history = History::open(&path).unwrap();
        assert_eq!(history.mark_for(1), 300);
        assert_eq!(history.mark_for(2), 0);
        // A new execution counts from 1: the old count is not written for it.
        history.set_generation(2);
        history.append(EntryType::UserMessage, "two".into(), None).unwrap();
        history.set_watermark(4);
        history.agent_chunk("a", None);
        history.set_generation(3);
        history.append(EntryType::UserMessage, "three".into(), None).unwrap();
        let entries = read(&path, 0, 100).unwrap().entries;
        let marks: Vec<(&str, Option<u64>, Option<i64>)> =
            entries.iter().map(|e| (e.content.as_str(), e.agent_seq, e.generation)).collect();
        assert_eq!(
            marks,
            [
                ("one", Some(300), Some(1)),
                ("two", Some(0), Some(2)),
                // Flushed when execution 3 began, it keeps its own execution and seq.
                ("a", Some(4), Some(2)),
                ("three", Some(0), Some(3)),
            ]
        );
        assert_eq!(history.mark_for(3), 0);
        assert_eq!(history.mark_for(2), 0);
    }

    #[test]
    fn a_torn_last_line_is_repaired_and_numbering_continues() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        {
            let mut history = History::open(&path).unwrap();
            history.append(EntryType::UserMessage, "one".into(), None).unwrap();
            history.append(EntryType::UserMessage, "two".into(), None).unwrap();
        }
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"seq":3,"at":1,"type":"user_mes"#).unwrap();
        drop(file);
        let mut history = History::open(&path).unwrap();
        assert_eq!(history.append(EntryType::UserMessage, "three".into(), None).unwrap(), 3);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.lines().all(|line| serde_json::from_str::<HistoryEntry>(line).is_ok()));
    }

    #[test]
    fn cut_off_notes_are_taken_out_wherever_they_stand() {
        let note = |why: &str| format!("{CUT_OFF}{why}]");
        let text = format!("one [1/3]{} and [2/3]{}", note("the agent exited"), note("x"));
        assert_eq!(without_cut_off_notes(&text), "one [1/3] and [2/3]");
        // An unended note is left as it is (it is no note of ours).
        let open = format!("a{CUT_OFF}no end");
        assert_eq!(without_cut_off_notes(&open), open);
        assert_eq!(without_cut_off_notes("[1/3] plain"), "[1/3] plain");
    }

    #[test]
    fn excerpts_cut_on_character_boundaries() {
        assert_eq!(excerpt("héllo wörld", 4), "héll");
        assert_eq!(excerpt("日本語テキスト", 3), "日本語");
        assert_eq!(excerpt("short", 100), "short");
        assert_eq!(excerpt_tail("héllo wörld", 3), "rld");
        assert_eq!(excerpt_tail("日本語", 5), "日本語");
        assert_eq!(excerpt_tail("", 5), "");
    }

    /// A tail torn while the writer has the history (cut, or a partial line written by
    /// another hand) is ended before the next entry, which stays whole; the torn line is
    /// read as damaged.
    #[test]
    fn a_torn_tail_met_while_writing_is_ended_not_glued_to_the_next_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut history = History::open(&path).unwrap();
        history.append_prompt("first".into(), "t1".into()).unwrap();
        let tear = |path: &Path| {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
            file.write_all(b"{\"seq\":9,\"at\":1,\"type\":\"agent_mes").unwrap();
        };
        tear(&path);
        history.append_prompt("second".into(), "t2".into()).unwrap();
        // Cut mid-line this time.
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 5).unwrap();
        history.append_prompt("third".into(), "t3".into()).unwrap();
        // The torn line and the cut entry are damaged lines; the entries around them stand.
        let read = read(&path, 0, 100).unwrap();
        let users: Vec<&str> = read.entries.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(users, ["first", "third"], "{read:?}");
        assert_eq!(read.damaged.len(), 2, "{read:?}");
        let mut history = History::open(&path).unwrap();
        history.append_prompt("fourth".into(), "t4".into()).unwrap();
        let read = super::read(&path, 0, 100).unwrap();
        let users: Vec<&str> = read.entries.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(users, ["first", "third", "fourth"], "{read:?}");
    }

    /// What waits in memory is taken over by a history opened again, marks and all, and
    /// is known by the execution it came from.
    #[test]
    fn what_waits_in_memory_moves_to_a_reopened_history_with_its_execution() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut history = History::open(&path).unwrap();
        history.set_generation(1);
        assert!(!history.holds_unwritten_beside(Some(2)), "nothing waits");
        history.agent_chunk("<a>", None);
        history.agent_chunk("<b>", None);
        assert!(!history.holds_unwritten_beside(Some(1)));
        assert!(history.holds_unwritten_beside(Some(2)) && history.holds_unwritten_beside(None));
        let mut reopened = History::open(&path).unwrap();
        reopened.take_unwritten(&mut history);
        assert!(!history.holds_unwritten_beside(Some(2)), "nothing left behind");
        reopened.flush_agent().unwrap();
        let entries = super::read(&path, 0, 10).unwrap().entries;
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].content, "<a><b>");
        assert_eq!(entries[0].generation, Some(1));
    }
}
