//! Reading a spool: [`SpoolReader`], from any seq after the acknowledged prefix, the backlog
//! from its segments and then each line as it is published.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;
use std::sync::Arc;

use protocol::control::Event;
use serde_json::value::RawValue;
use tokio::sync::watch;

use super::{Entry, Spool, SpoolError, io_err};

/// Reads events in order from a spool: the backlog from disk, then live events as they
/// are published. Each event is returned exactly once.
///
/// Seqs the spool cannot give (a damaged line, lines cut from a file or a file deleted
/// under it) are said once where they are missing: in the log's own words, an entry in
/// their place, when its entries can say it ([`Entry::unreadable`]: the supervisor's event
/// log, whose clients take a gap for a dropped notification), else as a message for
/// [`SpoolReader::take_damaged`] naming the seqs, the file and the line (agentctl's spool,
/// whose supervisor learns of it before the entry after the gap). Each such message is said
/// once per spool, however many readers meet the damage.
#[derive(Debug)]
pub struct SpoolReader<E = Event> {
    spool: Arc<Spool<E>>,
    /// The last seq returned.
    cursor: u64,
    last_seq_rx: watch::Receiver<u64>,
    /// The open segment: its first seq and a reader positioned after the last full line.
    file: Option<(u64, PathBuf, BufReader<File>)>,
    /// Bytes of a line whose end has not been written yet.
    partial: Vec<u8>,
    /// The open segment was seen closed and read to its end after that.
    drained_closed: bool,
    /// What was said of damage met since [`SpoolReader::take_damaged`] was last asked.
    damaged: Vec<String>,
    /// Damaged lines skipped since the last entry returned, each where (`FILE:LINE`) and
    /// why: the cause of a gap the next entry may reveal.
    skipped: Vec<(String, String)>,
    /// The newest seq the writer published, as last looked at.
    published: u64,
    /// A whole line read before its writer published it (a batch still being written): it
    /// is returned once published, so no reader sees what a kill could still cut.
    held: Option<(u64, Vec<u8>)>,
    /// Entries standing for unreadable seqs, returned before anything else.
    filling: Option<Filling>,
    /// The line that came after unreadable seqs, returned once their entries are.
    after_gap: Option<(u64, Vec<u8>)>,
    /// Published seqs not found where they should be: how far looking for them got.
    missing: Option<Missing>,
}

/// Unreadable seqs `next..=last`, each to be returned as an entry saying `why`.
#[derive(Debug)]
struct Filling {
    next: u64,
    last: u64,
    why: String,
}

/// The reader is caught up with what is on disk, but the writer published through
/// `published` ≥ `want`: the lines were cut away, or the reader's file is not the writer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Missing {
    want: u64,
    published: u64,
    /// The segment was read again from its start (its file may have been cut under the
    /// reader's position) and they were not there either.
    rescanned: bool,
}

impl<E: Entry> SpoolReader<E> {
    /// A reader after `after_seq`, with the segment file it starts in when that is already
    /// open (positioned after the last line it must not read).
    pub(super) fn new(
        spool: Arc<Spool<E>>,
        after_seq: u64,
        file: Option<(u64, PathBuf, BufReader<File>)>,
    ) -> SpoolReader<E> {
        let last_seq_rx = spool.last_seq_tx.subscribe();
        SpoolReader {
            spool,
            cursor: after_seq,
            last_seq_rx,
            file,
            partial: Vec::new(),
            drained_closed: false,
            damaged: Vec::new(),
            skipped: Vec::new(),
            published: 0,
            held: None,
            filling: None,
            after_gap: None,
            missing: None,
        }
    }
}

impl<E: Entry> SpoolReader<E> {
    /// The last seq returned (or the starting point).
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// The next event, waiting for it when caught up. Cancel safe: dropping the future
    /// between events loses nothing (the cursor only moves when an event is returned).
    pub async fn next(&mut self) -> Result<E, SpoolError> {
        self.next_checked(|line| serde_json::from_slice(line)).await
    }

    /// What was said of damage met since the last call, each once per spool: seqs that
    /// cannot be read (`events F–L … unreadable`, with the damaged lines, `FILE:LINE`, or
    /// the file they are missing from), and damaged lines that cost no seq. A damaged line
    /// (garbage, or a line cut short and followed by another) is skipped; the entries
    /// around it are read as usual. Empty for a log whose entries say it themselves
    /// ([`Entry::unreadable`]).
    pub fn take_damaged(&mut self) -> Vec<String> {
        std::mem::take(&mut self.damaged)
    }

    /// Records the damaged line just read from the open segment (its number is counted
    /// then: damage is rare, and the reader may have started mid-file). `cut`: the line
    /// ends where its file does, without a newline.
    fn skip_damaged(&mut self, err: &dyn std::fmt::Display, cut: bool) {
        let line = self.file.as_mut().and_then(|(_, path, reader)| {
            let end = io::Seek::stream_position(reader).ok()?;
            let mut prefix = Vec::new();
            io::Read::read_to_end(&mut io::Read::take(File::open(path).ok()?, end), &mut prefix)
                .ok()?;
            Some(prefix.iter().filter(|&&b| b == b'\n').count() + usize::from(cut))
        });
        let line = line.map_or_else(|| "?".to_owned(), |line| line.to_string());
        let at = format!("{}:{line}", self.current_path().display());
        if !self.skipped.iter().any(|(known, _)| *known == at) {
            self.skipped.push((at, err.to_string()));
        }
    }

    /// Says `message` once per spool (`about`: what it is about, the same whoever reads
    /// it): for [`SpoolReader::take_damaged`], unless the log's entries say it themselves.
    fn say(&mut self, about: &str, message: String) {
        if !self.spool.first_report(about) {
            return;
        }
        tracing::warn!("{message}");
        if !self.fills_gaps() {
            self.damaged.push(message);
        }
    }

    /// Whether the log's entries stand for unreadable seqs ([`Entry::unreadable`]).
    fn fills_gaps(&self) -> bool {
        E::unreadable(0, 0, "").is_some()
    }

    /// The damaged lines skipped before an entry that follows the cursor: they cost no
    /// seq, and are said as such.
    fn say_skipped_harmless(&mut self) {
        for (at, why) in std::mem::take(&mut self.skipped) {
            self.say(&at, format!("a damaged line was skipped ({at}: {why}); no event is missing"));
        }
    }

    /// Why seqs `first..=last` cannot be read: the damaged lines skipped in their place, or
    /// that they are missing.
    fn why_unreadable(&mut self, first: u64, last: u64) -> String {
        let what = if first == last {
            format!("event {first} is")
        } else {
            format!("events {first}–{last} are")
        };
        let skipped = std::mem::take(&mut self.skipped);
        if skipped.is_empty() {
            format!(
                "{what} unreadable and skipped: missing from {} (a file was cut short or \
                 deleted while it was written)",
                self.spool.dir.display()
            )
        } else {
            let lines: Vec<String> =
                skipped.iter().map(|(at, why)| format!("{at}: {why}")).collect();
            format!(
                "{what} unreadable and skipped: a damaged line in their place ({})",
                lines.join("; ")
            )
        }
    }

    /// Seqs `first..=last` cannot be read: said, and passed (`after`: the line that came
    /// after them, returned next).
    fn pass_unreadable(&mut self, first: u64, last: u64, after: Option<(u64, Vec<u8>)>) {
        let why = self.why_unreadable(first, last);
        let about = format!("seqs {first}–{last}");
        if self.fills_gaps() {
            if self.spool.first_report(&about) {
                tracing::warn!("{why}");
            }
            self.filling = Some(Filling { next: first, last, why });
            self.after_gap = after;
        } else {
            self.say(&about, why);
            self.cursor = last;
            self.after_gap = after;
        }
    }

    /// The next entry as its JSON text, unparsed: what a relay forwards without paying for a
    /// parse and a re-serialisation. Same ordering and cancel safety as [`SpoolReader::next`]
    /// (a line that is not JSON is skipped as damaged, as there).
    pub async fn next_raw(&mut self) -> Result<Box<RawValue>, SpoolError> {
        self.next_checked(|line| serde_json::from_slice(line)).await
    }

    /// The next entry and every further one already on disk, as one JSON array of their
    /// text (unparsed), up to `max_entries` entries or until the array passes `max_bytes`.
    /// Waits only for the first. Same ordering and cancel safety as [`SpoolReader::next`]
    /// (the only wait comes before anything is taken).
    pub async fn next_raw_batch(
        &mut self,
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<Box<RawValue>, SpoolError> {
        // Each line is checked once, as it is read; the array is their text joined.
        let text = |line: &[u8]| serde_json::from_slice::<Box<RawValue>>(line);
        let mut raws = vec![self.next_checked(text).await?];
        let mut bytes = raws[0].get().len();
        while raws.len() < max_entries && bytes < max_bytes {
            let Some(raw) = self.more_checked(text)? else { break };
            bytes += raw.get().len() + 1;
            raws.push(raw);
        }
        Ok(serde_json::value::to_raw_value(&raws).expect("UNWRAP: JSON texts"))
    }

    /// The next entry and every further one already on disk (up to `max_entries`),
    /// parsed. Waits only for the first; cancel safe like [`SpoolReader::next`].
    pub async fn next_batch(&mut self, max_entries: usize) -> Result<Vec<E>, SpoolError> {
        self.next_batch_with(max_entries, |_| None, |entry| entry).await
    }

    /// [`SpoolReader::next_batch`] for a relay that sends entries on in another form: each
    /// line as `fast` makes it from the text when it can (a relay's common entries, without
    /// building the entry), else as `slow` makes it from the parsed entry; a line neither
    /// reads is skipped as damaged. Waits only for the first; cancel safe likewise.
    pub async fn next_batch_with<T>(
        &mut self,
        max_entries: usize,
        mut fast: impl FnMut(&[u8]) -> Option<T>,
        mut slow: impl FnMut(E) -> T,
    ) -> Result<Vec<T>, SpoolError> {
        let mut make = |line: &[u8]| match fast(line) {
            Some(made) => Ok(made),
            None => serde_json::from_slice(line).map(&mut slow),
        };
        let mut made = vec![self.next_checked(&mut make).await?];
        while made.len() < max_entries {
            let Some(one) = self.more_checked(&mut make)? else { break };
            made.push(one);
        }
        Ok(made)
    }

    /// The next line `check` reads, waiting for it when caught up; a line it cannot read is
    /// skipped as damaged. The seq a line starts with is trusted only once the line is read
    /// whole (a damaged line does not move the cursor past the entry that may follow it
    /// with the same seq).
    async fn next_checked<T>(
        &mut self,
        mut check: impl FnMut(&[u8]) -> Result<T, serde_json::Error>,
    ) -> Result<T, SpoolError> {
        loop {
            if let Some(made) = self.more_checked(&mut check)? {
                return Ok(made);
            }
            self.wait_for_more().await?;
        }
    }

    /// [`SpoolReader::next_checked`] for a line already on disk, without waiting: `None`
    /// when there is none (yet).
    fn more_checked<T>(
        &mut self,
        mut check: impl FnMut(&[u8]) -> Result<T, serde_json::Error>,
    ) -> Result<Option<T>, SpoolError> {
        loop {
            let (seq, line, read) = match self.next_candidate()? {
                Some(candidate) => candidate,
                None => return Ok(None),
            };
            let made = match check(&line) {
                Ok(made) => made,
                Err(err) => {
                    self.skip_damaged(&err, false);
                    continue;
                }
            };
            if read && seq > self.cursor + 1 {
                // Seqs before this line cannot be read: said, then this line.
                self.pass_unreadable(self.cursor + 1, seq - 1, Some((seq, line)));
                continue;
            }
            if read {
                self.say_skipped_harmless();
            }
            self.cursor = seq;
            self.missing = None;
            return Ok(Some(made));
        }
    }

    /// The next line to return (its seq and bytes) and whether it was read from disk (else
    /// it stands for unreadable seqs, or was read before): an entry for an unreadable seq,
    /// the line after them, or the next line on disk.
    fn next_candidate(&mut self) -> Result<Option<(u64, Vec<u8>, bool)>, SpoolError> {
        if let Some(filling) = &mut self.filling {
            let seq = filling.next;
            let entry = E::unreadable(seq, super::now_ms(), &filling.why)
                .expect("UNWRAP: filling only for entries that say it");
            if seq == filling.last {
                self.filling = None;
            } else {
                filling.next += 1;
            }
            let line = serde_json::to_vec(&entry).expect("UNWRAP: spool entries always serialise");
            return Ok(Some((seq, line, false)));
        }
        if let Some((seq, line)) = self.after_gap.take() {
            return Ok(Some((seq, line, false)));
        }
        Ok(self.read_next()?.map(|(seq, line)| (seq, line, true)))
    }

    fn current_path(&self) -> PathBuf {
        self.file
            .as_ref()
            .map(|(_, path, _)| path.clone())
            .unwrap_or_else(|| self.spool.dir.clone())
    }

    /// Caught up with what is on disk: waits for the writer to publish more. When it
    /// published what is not there (cut away, or in a file deleted under the reader), the
    /// file is read again from its start, then those seqs are passed as unreadable: a
    /// reader never spins on, or waits forever for, seqs it will not find.
    async fn wait_for_more(&mut self) -> Result<(), SpoolError> {
        // The next seq wanted: the held line's, or any after the cursor.
        let want = self.held.as_ref().map_or(self.cursor + 1, |(seq, _)| *seq);
        let published = *self.last_seq_rx.borrow_and_update();
        if published < want {
            self.missing = None;
            self.last_seq_rx
                .wait_for(|&last| last >= want)
                .await
                .map_err(|_| SpoolError::Closed)?;
            return Ok(());
        }
        // The event is on disk: in a later segment, or the line was read partially before
        // its flush completed. Look again; then from the segment's start; then it is lost.
        match self.missing {
            Some(missing) if missing.want == want && !missing.rescanned => {
                self.missing = Some(Missing { rescanned: true, ..missing });
                self.file = None;
                self.partial.clear();
                self.skipped.clear();
            }
            Some(missing) if missing.want == want => {
                self.missing = None;
                if !self.partial.is_empty() {
                    // The line the file ends in was cut short: it will not be finished.
                    self.skip_damaged(&"the line is cut short", true);
                    self.partial.clear();
                }
                self.pass_unreadable(want, missing.published, None);
            }
            _ => self.missing = Some(Missing { want, published, rescanned: false }),
        }
        Ok(())
    }

    /// Whether the writer published `seq` (looking again only when the last look says no).
    fn is_published(&mut self, seq: u64) -> bool {
        if seq > self.published {
            self.published = *self.last_seq_rx.borrow();
        }
        seq <= self.published
    }

    /// Opens the segment that holds the seq after the cursor, or the next one that exists
    /// (a deleted segment holds nothing): false when there is none.
    fn open_segment(&mut self) -> Result<bool, SpoolError> {
        let mut segment = self.spool.segment_for(self.cursor + 1)?;
        loop {
            match File::open(&segment.path) {
                Ok(file) => {
                    self.file = Some((segment.first_seq, segment.path, BufReader::new(file)));
                    self.partial.clear();
                    self.drained_closed = false;
                    return Ok(true);
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    match self.spool.segment_after(segment.first_seq) {
                        Some(next) => segment = next,
                        None => return Ok(false),
                    }
                }
                Err(err) => return Err(io_err(&segment.path)(err)),
            }
        }
    }

    /// The next line already on disk and published (its seq and its bytes, without the
    /// newline), or `None` when caught up. Only the seq is parsed.
    pub(super) fn read_next(&mut self) -> Result<Option<(u64, Vec<u8>)>, SpoolError> {
        if let Some((seq, _)) = self.held {
            return Ok(if self.is_published(seq) { self.held.take() } else { None });
        }
        loop {
            if self.file.is_none() && !self.open_segment()? {
                return Ok(None);
            }
            let (first_seq, path, reader) = self.file.as_mut().expect("UNWRAP: opened above");
            let read = reader.read_until(b'\n', &mut self.partial).map_err(io_err(path))?;
            if self.partial.last() == Some(&b'\n') {
                let seq = match line_seq(&self.partial) {
                    Ok(seq) => seq,
                    Err(err) => {
                        self.partial.clear();
                        self.skip_damaged(&err, false);
                        continue;
                    }
                };
                let mut line = std::mem::take(&mut self.partial);
                if seq > self.cursor {
                    line.pop();
                    if !self.is_published(seq) {
                        // Held until its writer publishes it — but only a line that is
                        // JSON: the seq a damaged one starts with may never be published,
                        // and the entries after it must not wait for it.
                        if let Err(err) = serde_json::from_slice::<serde::de::IgnoredAny>(&line) {
                            self.skip_damaged(&err, false);
                            continue;
                        }
                        self.held = Some((seq, line));
                        return Ok(None);
                    }
                    return Ok(Some((seq, line)));
                }
                // A line before the cursor: damage skipped before it cost nothing read here.
                if !self.skipped.is_empty() {
                    self.say_skipped_harmless();
                }
                continue;
            }
            if read > 0 {
                // A partial line: its end is still being written.
                return Ok(None);
            }
            // End of this segment's data. A closed segment will not grow, but lines may have
            // been appended between our last read and its closing: read it to its end once
            // more after seeing it closed, and only then move on.
            let first_seq = *first_seq;
            if self.spool.is_active(first_seq) {
                return Ok(None);
            }
            if !self.drained_closed {
                self.drained_closed = true;
                continue;
            }
            if !self.partial.is_empty() {
                // A closed segment ending mid-line: that line was cut, and will not end.
                self.skip_damaged(&"the line is cut short", true);
                self.partial.clear();
            }
            self.file = None;
            if self.spool.segment_for(self.cursor + 1)?.first_seq == first_seq {
                // The cursor's segment is this one: it ended before the cursor's seq (seqs
                // were lost after it, see `Spool::open_marked`), so read the next one.
                let Some(mut next) = self.spool.segment_after(first_seq) else { return Ok(None) };
                loop {
                    match File::open(&next.path) {
                        Ok(file) => {
                            self.file = Some((next.first_seq, next.path, BufReader::new(file)));
                            self.drained_closed = false;
                            break;
                        }
                        Err(err) if err.kind() == io::ErrorKind::NotFound => {
                            match self.spool.segment_after(next.first_seq) {
                                Some(after) => next = after,
                                None => return Ok(None),
                            }
                        }
                        Err(err) => return Err(io_err(&next.path)(err)),
                    }
                }
            }
        }
    }
}

/// The seq of a spool line. Every writer puts it first (`{"seq":N,…`), so it is read from
/// there without going through the rest; a line that starts otherwise is parsed for it.
/// The line's JSON is checked by whoever reads the entry (each reader skips a line that is
/// not JSON, as damaged).
pub(super) fn line_seq(line: &[u8]) -> Result<u64, serde_json::Error> {
    if let Some(rest) = line.strip_prefix(b"{\"seq\":") {
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let after = rest.get(digits).copied();
        let leading_zero = digits > 1 && rest[0] == b'0';
        if digits > 0 && !leading_zero && matches!(after, Some(b',' | b'}')) {
            let text = std::str::from_utf8(&rest[..digits]).expect("UNWRAP: ASCII digits");
            if let Ok(seq) = text.parse() {
                return Ok(seq);
            }
        }
    }
    #[derive(serde::Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    serde_json::from_slice::<SeqOnly>(line).map(|SeqOnly { seq }| seq)
}
