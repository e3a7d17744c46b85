//! The event spool: every event is appended to disk before it is published, and readers
//! replay from any point after the acknowledged prefix, then follow live.
//!
//! Layout: `DIR/events-<first seq>.jsonl` segments, one JSON event per line. The newest
//! segment is active (appended to); a segment is closed when it passes the size limit.
//! `ack(seq)` deletes every segment whose events are all acknowledged (rotating the active
//! one first when it is fully acknowledged), so the spool stays bounded while a supervisor
//! is connected and acking.
//!
//! Publication: after a line is written and flushed to the kernel, the new `last_seq` is
//! sent on a watch channel. Readers read the files (the page cache, in practice) and wait
//! on that channel when caught up — so replay and live are one code path, and a slow
//! reader can never miss or duplicate an event.
//!
//! Durability: lines are flushed to the kernel, not fsynced. They survive agentctl's own
//! crash (the kernel keeps them); a machine crash loses the agent anyway.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use protocol::control::{Event, EventKind};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

/// What a spool holds: serialisable entries that carry their own sequence number.
pub trait Entry: Serialize + DeserializeOwned + Send + 'static {
    /// The entry's seq.
    fn seq(&self) -> u64;

    /// For an entry written by [`Spool::append_all`] with others: the seq of the batch's
    /// last entry. A log whose readers rely on a batch being whole (the supervisor's event
    /// log: one mark covers the batch) keeps it, so [`Spool::open`] can cut a batch a kill
    /// left half-written; others need not (`None`: every entry stands alone).
    fn batch_last(&self) -> Option<u64> {
        None
    }

    /// Records the seq of the last entry of the batch this entry is written in (only called
    /// for batches of more than one entry).
    fn set_batch_last(&mut self, _last: u64) {}

    /// An entry standing for seq `seq`, which cannot be read (a damaged line, lines cut or
    /// deleted), saying `why` (the seqs, the file and line): for a log whose readers need
    /// every seq (the supervisor's event log: its clients take a missing seq for a dropped
    /// notification and ask again), readers return it in the seq's place. `None` (the
    /// default): readers skip the seq and say why through [`SpoolReader::take_damaged`].
    fn unreadable(_seq: u64, _at: u64, _why: &str) -> Option<Self> {
        None
    }
}

impl Entry for Event {
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// The spool's directory under agentctl's state dir.
pub const SPOOL_DIR: &str = "spool";

/// The default size at which the active segment is closed.
pub const DEFAULT_SEGMENT_BYTES: u64 = 4 * 1024 * 1024;

/// Errors from the spool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpoolError {
    /// Reading or writing a segment failed.
    #[error("spool I/O on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The events asked for were acknowledged and dropped.
    #[error(
        "events after {after_seq} were requested, but everything up to {acked_seq} was acknowledged and dropped"
    )]
    Pruned {
        /// What was asked for.
        after_seq: u64,
        /// What has been dropped.
        acked_seq: u64,
    },
    /// A spool line did not parse (the file was damaged).
    #[error("damaged spool line in {path}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The spool was closed while waiting for events.
    #[error("the spool is closed")]
    Closed,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io { path: path.to_owned(), source }
}

/// The spool. Shared behind an `Arc`; appends are serialised by a short std mutex (held
/// for one write syscall, never across an await). Generic over its entries: agentctl
/// spools [`Event`]s, the supervisor spools each session's API events.
#[derive(Debug)]
pub struct Spool<E = Event> {
    dir: PathBuf,
    segment_bytes: u64,
    inner: Mutex<Inner>,
    last_seq_tx: watch::Sender<u64>,
    /// Why appends are failing, while they are (set by the writer that keeps retrying).
    stalled: watch::Sender<Option<String>>,
    /// The bytes the segments hold on disk, as they change (appends, acknowledged
    /// segments dropped): what a writer bounded by it awaits.
    disk_tx: watch::Sender<u64>,
    /// A writer waits for room (see [`Spool::room_below`]).
    backlog_full: watch::Sender<bool>,
    _entries: std::marker::PhantomData<fn() -> E>,
}

#[derive(Debug)]
struct Inner {
    /// Oldest first; the last one is active.
    segments: VecDeque<Segment>,
    /// The active segment, open for appending; `None` after [`Spool::release`] until the
    /// next write (an idle session's log holds no file open).
    active: Option<File>,
    next_seq: u64,
    acked_seq: u64,
    /// Where every append records the highest seq issued (see [`Spool::open_marked`]).
    mark: Option<PathBuf>,
    /// What readers said of damage (see [`Spool::first_report`]).
    reported: std::collections::HashSet<String>,
}

#[derive(Debug, Clone)]
struct Segment {
    first_seq: u64,
    /// 0 while empty.
    last_seq: u64,
    path: PathBuf,
    bytes: u64,
}

impl Spool<Event> {
    /// Appends one agent event and publishes it. Returns its seq.
    pub fn append(&self, kind: EventKind) -> Result<u64, SpoolError> {
        self.append_with(|seq, at| Event { seq, at, kind })
    }

    /// Appends several agent events with one write (all or none, as
    /// [`Spool::append_all`]) and publishes them; a failed write hands them back. Returns
    /// the last seq (the current one when `kinds` is empty).
    pub fn try_append_kinds(
        &self,
        kinds: Vec<EventKind>,
    ) -> Result<u64, Box<(SpoolError, Vec<EventKind>)>> {
        /// [`Event`]'s serialised form, borrowing its kind (so a failed write can hand
        /// the kinds back without having cloned them).
        #[derive(Serialize)]
        struct Borrowed<'a> {
            seq: u64,
            at: u64,
            #[serde(flatten)]
            kind: &'a EventKind,
        }
        let mut inner = self.lock();
        let first = inner.next_seq;
        if kinds.is_empty() {
            return Ok(first - 1);
        }
        let at = now_ms();
        let mut lines = Vec::with_capacity(kinds.len() * 256);
        for (n, kind) in kinds.iter().enumerate() {
            let event = Borrowed { seq: first + n as u64, at, kind };
            serde_json::to_writer(&mut lines, &event).expect("UNWRAP: events always serialise");
            lines.push(b'\n');
        }
        let last = first + kinds.len() as u64 - 1;
        if let Err(err) = self.write_lines(&mut inner, &lines, last) {
            return Err(Box::new((err, kinds)));
        }
        drop(inner);
        self.last_seq_tx.send_replace(last);
        Ok(last)
    }
}

impl<E: Entry> Spool<E> {
    /// Opens a fresh spool in `dir` (created 0700), removing segments a previous agentctl
    /// left there: a new agentctl is a new execution with its own sequence.
    pub fn create(dir: &Path, segment_bytes: u64) -> Result<Spool<E>, SpoolError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err(dir))?;
        for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let path = entry.map_err(io_err(dir))?.path();
            if is_segment(&path) {
                std::fs::remove_file(&path).map_err(io_err(&path))?;
            }
        }
        let (segment, active) = open_segment(dir, 1)?;
        let (last_seq_tx, _) = watch::channel(0);
        Ok(Spool {
            dir: dir.to_owned(),
            segment_bytes,
            inner: Mutex::new(Inner {
                segments: VecDeque::from([segment]),
                active: Some(active),
                next_seq: 1,
                acked_seq: 0,
                mark: None,
                reported: Default::default(),
            }),
            last_seq_tx,
            stalled: watch::channel(None).0,
            disk_tx: watch::channel(0).0,
            backlog_full: watch::channel(false).0,
            _entries: std::marker::PhantomData,
        })
    }

    /// Opens the spool in `dir`, continuing its sequence when it holds segments (a torn
    /// last line is cut off), or creates it. For logs that outlive their process, like the
    /// supervisor's per-session event log.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<Spool<E>, SpoolError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err(dir))?;
        let mut firsts: Vec<u64> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let path = entry.map_err(io_err(dir))?.path();
            if let Some(first) = is_segment(&path)
                .then(|| {
                    path.file_name()?
                        .to_str()?
                        .strip_prefix("events-")?
                        .strip_suffix(".jsonl")?
                        .parse::<u64>()
                        .ok()
                })
                .flatten()
            {
                firsts.push(first);
            }
        }
        firsts.sort_unstable();
        let Some(&active_first) = firsts.last() else { return Spool::create(dir, segment_bytes) };
        let mut segments = VecDeque::new();
        for pair in firsts.windows(2) {
            let path = dir.join(format!("events-{:020}.jsonl", pair[0]));
            let bytes = std::fs::metadata(&path).map_err(io_err(&path))?.len();
            segments.push_back(Segment { first_seq: pair[0], last_seq: pair[1] - 1, path, bytes });
        }
        let path = dir.join(format!("events-{active_first:020}.jsonl"));
        let text = std::fs::read(&path).map_err(io_err(&path))?;
        let mut whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |idx| idx + 1);
        let (mut last_seq, mut damaged) = newest_entry::<E>(&text[..whole]);
        if let Some((seq, Some(batch_last))) = last_seq.filter(|(seq, last)| last > &Some(*seq)) {
            // A batch the writer was killed writing: none of it was published, all of it goes
            // (its last entry's marks would claim what the missing ones hold).
            whole = batch_start::<E>(&text[..whole], batch_last);
            tracing::warn!(path = %path.display(), seq, batch_last, "cutting a batch a kill left unfinished");
            (last_seq, damaged) = newest_entry::<E>(&text[..whole]);
        }
        let last_seq = last_seq.map_or(0, |(seq, _)| seq);
        if damaged > 0 {
            tracing::warn!(path = %path.display(), damaged, "the spool ends in damaged lines; readers skip them");
        }
        let active = std::fs::OpenOptions::new().append(true).open(&path).map_err(io_err(&path))?;
        active.set_len(whole as u64).map_err(io_err(&path))?;
        segments.push_back(Segment {
            first_seq: active_first,
            last_seq,
            path,
            bytes: whole as u64,
        });
        let next_seq = if last_seq == 0 { active_first } else { last_seq + 1 };
        let held: u64 = segments.iter().map(|s| s.bytes).sum();
        let (last_seq_tx, _) = watch::channel(next_seq - 1);
        // What retention (or acks) dropped before is known as dropped.
        let acked_seq = segments.front().map_or(0, |oldest| oldest.first_seq.saturating_sub(1));
        Ok(Spool {
            dir: dir.to_owned(),
            segment_bytes,
            inner: Mutex::new(Inner {
                segments,
                active: Some(active),
                next_seq,
                acked_seq,
                mark: None,
                reported: Default::default(),
            }),
            last_seq_tx,
            stalled: watch::channel(None).0,
            disk_tx: watch::channel(held).0,
            backlog_full: watch::channel(false).0,
            _entries: std::marker::PhantomData,
        })
    }

    /// Like [`Spool::open`], for a log whose seqs must never go backwards because clients
    /// hold cursors into it (the supervisor's per-session event log). Every append records
    /// the highest seq issued in the file `mark` (beside the log, so it outlives the log's
    /// directory); `floor` is the highest seq the caller's own records know was issued.
    /// When the log holds less than the higher of the two — cut, emptied or deleted while
    /// nobody wrote it — numbering continues after it in a new segment, and the seqs lost
    /// are returned. Readers asking for seqs in the gap get what follows it.
    pub fn open_marked(
        dir: &Path,
        segment_bytes: u64,
        mark: &Path,
        floor: u64,
    ) -> Result<(Spool<E>, Option<std::ops::RangeInclusive<u64>>), SpoolError> {
        let spool = Spool::open(dir, segment_bytes)?;
        let marked = match std::fs::read_to_string(mark) {
            Ok(text) => text.trim().parse::<u64>().unwrap_or_else(|err| {
                tracing::warn!(path = %mark.display(), %err, "a damaged seq mark is ignored");
                0
            }),
            Err(err) if err.kind() == io::ErrorKind::NotFound => 0,
            Err(err) => return Err(SpoolError::Io { path: mark.to_owned(), source: err }),
        };
        let issued = floor.max(marked);
        let mut inner = spool.lock();
        inner.mark = Some(mark.to_owned());
        let lost = (issued >= inner.next_seq).then(|| inner.next_seq..=issued);
        if lost.is_some() {
            inner.next_seq = issued + 1;
            spool.rotate(&mut inner)?;
            spool.write_mark(&mut inner, issued);
        }
        drop(inner);
        Ok((spool, lost))
    }

    /// Records `last` as the highest seq issued, when the spool keeps a mark (opened for
    /// the write only: a live log holds one descriptor, its active segment). A failure is
    /// only logged: the entries are written, and the mark is the second of two witnesses.
    fn write_mark(&self, inner: &mut Inner, last: u64) {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let Some(path) = &inner.mark else { return };
        let written = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            // Fixed width: a later mark always covers an earlier one.
            .and_then(|file| file.write_all_at(format!("{last:020}\n").as_bytes(), 0));
        if let Err(err) = written {
            tracing::warn!(path = %path.display(), %err, "cannot record the seq mark");
        }
    }

    /// Appends the entry built from the next seq and the current time (Unix ms), and
    /// publishes it. Returns its seq.
    pub fn append_with(&self, build: impl FnOnce(u64, u64) -> E) -> Result<u64, SpoolError> {
        self.try_append_with(build).map_err(|(err, _)| err)
    }

    /// Like [`Spool::append_with`], but a failed write hands the entry back, so the caller
    /// can try again without having to keep a copy.
    pub fn try_append_with(
        &self,
        build: impl FnOnce(u64, u64) -> E,
    ) -> Result<u64, (SpoolError, E)> {
        let mut inner = self.lock();
        let seq = inner.next_seq;
        let entry = build(seq, now_ms());
        let mut line = serde_json::to_vec(&entry).expect("UNWRAP: spool entries always serialise");
        line.push(b'\n');
        if let Err(err) = self.write_lines(&mut inner, &line, seq) {
            return Err((err, entry));
        }
        drop(inner);
        self.last_seq_tx.send_replace(seq);
        Ok(seq)
    }

    /// Appends several entries with one write. A process killed meanwhile may leave any
    /// prefix of that write on disk (the kernel stops copying a large write between pages
    /// when the process is killed): for entries that keep their batch
    /// ([`Entry::batch_last`]), [`Spool::open`] cuts a batch left unfinished, so the log
    /// holds all of them or none; for others, whole lines of a prefix stay. Returns the
    /// last seq.
    pub fn append_all<K>(
        &self,
        items: Vec<K>,
        build: impl Fn(u64, u64, K) -> E,
    ) -> Result<u64, SpoolError> {
        let mut inner = self.lock();
        let first = inner.next_seq;
        let at = now_ms();
        let mut lines = Vec::new();
        let mut seq = first;
        let batch_last = (items.len() > 1).then(|| first + items.len() as u64 - 1);
        for item in items {
            let mut entry = build(seq, at, item);
            if let Some(last) = batch_last {
                entry.set_batch_last(last);
            }
            serde_json::to_writer(&mut lines, &entry)
                .expect("UNWRAP: spool entries always serialise");
            lines.push(b'\n');
            seq += 1;
        }
        let last = seq - 1;
        if last < first {
            return Ok(first - 1);
        }
        self.write_lines(&mut inner, &lines, last)?;
        drop(inner);
        self.last_seq_tx.send_replace(last);
        Ok(last)
    }

    /// Writes whole lines, the last of them for seq `last`, to the active segment and counts
    /// them. A failed (short) write — a full disk — is cut back to the last whole line and
    /// counts nothing, so the next line is not glued to half of this one.
    fn write_lines(&self, inner: &mut Inner, lines: &[u8], last: u64) -> Result<(), SpoolError> {
        self.check_active(inner)?;
        let (path, before) = {
            let active = inner.segments.back().expect("UNWRAP: there is always an active segment");
            (active.path.clone(), active.bytes)
        };
        let active = inner.active.as_mut().expect("UNWRAP: opened by check_active");
        if let Err(err) = active.write_all(lines) {
            if let Err(cut) = active.set_len(before) {
                tracing::error!(%cut, path = %path.display(), "cannot cut a torn spool line");
            }
            let _ = std::io::Seek::seek(active, std::io::SeekFrom::Start(before));
            return Err(SpoolError::Io { path, source: err });
        }
        inner.next_seq = last + 1;
        self.write_mark(inner, last);
        let active = inner.segments.back_mut().expect("UNWRAP: there is always an active segment");
        active.last_seq = last;
        active.bytes += lines.len() as u64;
        let full = active.bytes >= self.segment_bytes;
        self.disk_tx.send_replace(inner.segments.iter().map(|s| s.bytes).sum());
        if full && let Err(err) = self.rotate(inner) {
            // The lines are written; a failed rotation only delays the next segment.
            tracing::error!(%err, "cannot rotate the spool");
        }
        Ok(())
    }

    /// Opens the active segment's file when it is not open, and makes sure it is as this
    /// writer left it. A file cut short, written by another hand or deleted (its directory
    /// too) under a live writer would take the next lines after a torn one, or where no
    /// reader finds them: the writer starts a new segment at the next seq instead, so what
    /// it writes is whole and read. The seqs that are gone stay gone: readers pass them as
    /// unreadable, and numbering goes on.
    fn check_active(&self, inner: &mut Inner) -> Result<(), SpoolError> {
        use std::os::unix::fs::MetadataExt;
        let (path, bytes) = {
            let active = inner.segments.back().expect("UNWRAP: there is always an active segment");
            (active.path.clone(), active.bytes)
        };
        if inner.active.is_none() {
            match std::fs::OpenOptions::new().append(true).open(&path) {
                Ok(reopened) => inner.active = Some(reopened),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    return self.start_over(inner, "its file was deleted");
                }
                Err(err) => return Err(SpoolError::Io { path, source: err }),
            }
        }
        let file = inner.active.as_ref().expect("UNWRAP: opened above");
        let meta = file.metadata().map_err(io_err(&path))?;
        if meta.nlink() == 0 {
            return self.start_over(inner, "its file was deleted");
        }
        if meta.len() != bytes {
            let why = format!("its file holds {} bytes, not the {bytes} written", meta.len());
            return self.start_over(inner, &why);
        }
        Ok(())
    }

    /// Starts a new active segment at the next seq, the one before having been cut, changed
    /// or deleted under the writer (`why`): segments whose files are gone are forgotten
    /// (they hold nothing), the others counted as they are, the directory made again.
    fn start_over(&self, inner: &mut Inner, why: &str) -> Result<(), SpoolError> {
        tracing::warn!(
            dir = %self.dir.display(),
            next_seq = inner.next_seq,
            "the spool's active segment changed under its writer ({why}): a new segment starts; \
             readers pass what is gone as unreadable"
        );
        inner.active = None;
        inner.segments.retain_mut(|segment| match std::fs::metadata(&segment.path) {
            Ok(meta) => {
                segment.bytes = meta.len();
                true
            }
            Err(_) => false,
        });
        if inner.segments.back().is_some_and(|segment| segment.first_seq >= inner.next_seq) {
            // An active segment with nothing in it yet: replaced by the new one.
            inner.segments.pop_back();
        }
        let (segment, file) = open_segment(&self.dir, inner.next_seq)?;
        inner.active = Some(file);
        inner.segments.push_back(segment);
        self.disk_tx.send_replace(inner.segments.iter().map(|s| s.bytes).sum());
        Ok(())
    }

    /// Marks everything up to `seq` acknowledged and drops the segments that holds. A seq
    /// beyond the last event is clamped to it. Returns the acknowledged seq.
    ///
    /// The acknowledgement is taken even when the disk will not let segments go: a new
    /// active segment that cannot be made (a full disk) leaves the acknowledged one active,
    /// written on and dropped by a later ack; a file that cannot be removed stays listed
    /// (and counted) for the next. Refusing the ack would only make the supervisor take
    /// this agentctl for lost.
    pub fn ack(&self, seq: u64) -> u64 {
        let mut inner = self.lock();
        let last = inner.next_seq - 1;
        inner.acked_seq = inner.acked_seq.max(seq.min(last));
        let acked = inner.acked_seq;
        let active_done =
            inner.segments.back().is_some_and(|s| s.last_seq != 0 && s.last_seq <= acked);
        if active_done && let Err(err) = self.rotate(&mut inner) {
            tracing::warn!(%err, "cannot start a new spool segment; the acknowledged one stays");
        }
        while inner.segments.len() > 1
            && inner.segments.front().is_some_and(|s| s.last_seq <= acked)
        {
            let path = inner.segments.front().map(|s| s.path.clone()).unwrap_or_default();
            if let Err(err) = remove_segment(&path) {
                tracing::warn!(%err, "cannot remove an acknowledged spool segment");
                break;
            }
            inner.segments.pop_front();
        }
        self.disk_tx.send_replace(inner.segments.iter().map(|s| s.bytes).sum());
        acked
    }

    /// Forces every appended entry to disk. Closed segments are synced as they close, so
    /// syncing the active one suffices. (agentctl does not need this; the supervisor syncs
    /// before it acknowledges.)
    pub fn sync(&self) -> Result<(), SpoolError> {
        let inner = self.lock();
        let path = inner.segments.back().map(|s| s.path.clone()).unwrap_or_default();
        match &inner.active {
            Some(file) => file.sync_data().map_err(io_err(&path)),
            // Released: what was written went through a handle since closed; syncing the
            // file through a new one flushes it all the same. A file deleted meanwhile holds
            // nothing to sync (the next write starts a new one).
            None => match File::open(&path).and_then(|file| file.sync_data()) {
                Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
                synced => synced.map_err(io_err(&path)),
            },
        }
    }

    /// Closes the active segment's file until the next write (which reopens it), so a
    /// spool that is not being written holds no descriptor. Readers are not affected.
    pub fn release(&self) {
        self.lock().active = None;
    }

    /// The newest entry, read back from disk.
    pub fn last_entry(&self) -> Result<Option<E>, SpoolError> {
        let paths: Vec<PathBuf> =
            self.lock().segments.iter().rev().take(2).map(|s| s.path.clone()).collect();
        for path in paths {
            let text = match std::fs::read(&path) {
                Ok(text) => text,
                // Deleted under the log: it holds nothing.
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(io_err(&path)(err)),
            };
            let mut newest = None;
            for line in text.split(|&b| b == b'\n').filter(|line| !line.is_empty()).rev() {
                match serde_json::from_slice(line) {
                    Ok(entry) => return Ok(Some(entry)),
                    // A damaged or cut line: the newest that reads is the newest entry.
                    Err(source) => {
                        newest.get_or_insert(SpoolError::Corrupt { path: path.clone(), source });
                    }
                }
            }
            if let Some(err) = newest {
                return Err(err);
            }
        }
        Ok(None)
    }

    /// The newest event's seq (0 before any).
    pub fn last_seq(&self) -> u64 {
        *self.last_seq_tx.borrow()
    }

    /// Records why appends are failing (`None`: they work again).
    pub fn set_stalled(&self, why: Option<String>) {
        self.stalled.send_if_modified(|now| {
            let changed = now.is_some() != why.is_some();
            *now = why;
            changed
        });
    }

    /// Why appends are failing, if they are.
    pub fn stalled(&self) -> Option<String> {
        self.stalled.borrow().clone()
    }

    /// Retention: drops the oldest closed segments while the spool holds more than
    /// `max_bytes` (the active segment is always kept, so at least the newest
    /// `max_bytes − one segment` stay). Readers asking for a dropped event are refused
    /// ([`SpoolError::Pruned`]). Returns the newest seq no longer kept (0: none dropped).
    pub fn retain(&self, max_bytes: u64) -> Result<u64, SpoolError> {
        let mut inner = self.lock();
        let mut total: u64 = inner.segments.iter().map(|s| s.bytes).sum();
        while total > max_bytes && inner.segments.len() > 1 {
            let segment = inner.segments.pop_front().expect("UNWRAP: more than one");
            remove_segment(&segment.path)?;
            total -= segment.bytes;
            inner.acked_seq = inner.acked_seq.max(segment.last_seq);
        }
        Ok(inner.acked_seq)
    }

    /// A receiver that changes when appends start or stop failing.
    pub fn watch_stalled(&self) -> watch::Receiver<Option<String>> {
        self.stalled.subscribe()
    }

    /// The highest acknowledged seq.
    pub fn acked_seq(&self) -> u64 {
        self.lock().acked_seq
    }

    /// Bytes currently on disk, over all segments.
    pub fn disk_bytes(&self) -> u64 {
        self.lock().segments.iter().map(|s| s.bytes).sum()
    }

    /// Waits until the segments hold less than `bytes` on disk (acknowledgements drop
    /// segments): a writer's flow control.
    pub async fn room_below(&self, bytes: u64) {
        let mut disk = self.disk_tx.subscribe();
        // Said while it waits, so the reader acknowledges what it holds durably.
        self.backlog_full.send_replace(true);
        let _ = disk.wait_for(|&held| held < bytes).await;
        self.backlog_full.send_replace(false);
    }

    /// Whether a writer waits for room, as it changes.
    pub fn watch_backlog_full(&self) -> watch::Receiver<bool> {
        self.backlog_full.subscribe()
    }

    /// The spool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A reader of every event with `seq > after_seq`, then of live ones.
    pub fn reader(self: &Arc<Self>, after_seq: u64) -> Result<SpoolReader<E>, SpoolError> {
        let inner = self.lock();
        if after_seq < inner.acked_seq {
            return Err(SpoolError::Pruned { after_seq, acked_seq: inner.acked_seq });
        }
        // Subscribing at the tail (the common case: a client that wants what happens from
        // now on) starts at the end of what is written, instead of reading the active
        // segment from its start to skip every line in it.
        let mut file = None;
        if let Some(active) = inner.segments.back()
            && active.last_seq != 0
            && after_seq == active.last_seq
        {
            match File::open(&active.path) {
                Ok(mut handle) => {
                    io::Seek::seek(&mut handle, io::SeekFrom::Start(active.bytes))
                        .map_err(io_err(&active.path))?;
                    file = Some((active.first_seq, active.path.clone(), BufReader::new(handle)));
                }
                // Deleted under the writer: the reader finds the next segment when it comes.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(io_err(&active.path)(err)),
            }
        }
        Ok(SpoolReader::new(Arc::clone(self), after_seq, file))
    }

    fn rotate(&self, inner: &mut Inner) -> Result<(), SpoolError> {
        if let Some(closing) = inner.segments.back() {
            match &inner.active {
                Some(file) => file.sync_data(),
                None => match File::open(&closing.path) {
                    Ok(file) => file.sync_data(),
                    // Deleted under the writer: nothing to sync.
                    Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(err) => Err(err),
                },
            }
            .map_err(io_err(&closing.path))?;
        }
        let (segment, file) = open_segment(&self.dir, inner.next_seq)?;
        inner.active = Some(file);
        inner.segments.push_back(segment);
        Ok(())
    }

    /// Whether `message` about damage is new: readers say each once per spool, however
    /// many meet the damage (a subscriber that resubscribes before it reads it again).
    fn first_report(&self, message: &str) -> bool {
        /// A bound on what is remembered (damage is rare; a file of garbage is not).
        const MAX_REPORTS: usize = 4096;
        let mut inner = self.lock();
        if inner.reported.len() >= MAX_REPORTS {
            inner.reported.clear();
        }
        inner.reported.insert(message.to_owned())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("UNWRAP: never poisoned")
    }

    /// The segment that holds `seq` (or will: the active one; or, for a seq lost before the
    /// oldest segment, that one). `Pruned` when `seq` was in a segment already dropped by an
    /// ack or retention.
    fn segment_for(&self, seq: u64) -> Result<Segment, SpoolError> {
        let inner = self.lock();
        match inner.segments.iter().rev().find(|segment| segment.first_seq <= seq) {
            Some(segment) => Ok(segment.clone()),
            None if seq > inner.acked_seq && !inner.segments.is_empty() => {
                Ok(inner.segments.front().expect("UNWRAP: checked non-empty").clone())
            }
            None => Err(SpoolError::Pruned { after_seq: seq - 1, acked_seq: inner.acked_seq }),
        }
    }

    /// The segment after the one starting at `first_seq`, if there is one.
    fn segment_after(&self, first_seq: u64) -> Option<Segment> {
        self.lock().segments.iter().find(|segment| segment.first_seq > first_seq).cloned()
    }

    /// Whether the segment starting at `first_seq` is still the active one.
    fn is_active(&self, first_seq: u64) -> bool {
        self.lock().segments.back().is_some_and(|s| s.first_seq == first_seq)
    }
}

/// The newest entry of whole lines that parses (its seq and batch end), and how many
/// damaged lines follow it: those are left for readers to skip (and say), not a reason to
/// lose the log.
fn newest_entry<E: Entry>(lines: &[u8]) -> (Option<(u64, Option<u64>)>, usize) {
    let mut damaged = 0;
    let newest =
        lines.split(|&b| b == b'\n').filter(|line| !line.is_empty()).rev().find_map(|line| {
            match serde_json::from_slice::<E>(line) {
                Ok(entry) => Some((entry.seq(), entry.batch_last())),
                Err(_) => {
                    damaged += 1;
                    None
                }
            }
        });
    (newest, damaged)
}

/// Where the batch ending at `batch_last` begins among whole `lines`: the offset of its
/// first line (the batch's lines are the newest ones, each naming `batch_last`).
fn batch_start<E: Entry>(lines: &[u8], batch_last: u64) -> usize {
    let mut start = lines.len();
    // Lines end in '\n'; walk them from the newest.
    while start > 0 {
        let line_start =
            lines[..start - 1].iter().rposition(|&b| b == b'\n').map_or(0, |at| at + 1);
        let entry = serde_json::from_slice::<E>(&lines[line_start..start - 1]);
        if entry.ok().and_then(|entry| entry.batch_last()) != Some(batch_last) {
            break;
        }
        start = line_start;
    }
    start
}

/// Removes a segment's file (one already gone is removed).
fn remove_segment(path: &Path) -> Result<(), SpoolError> {
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(io_err(path)(err)),
        _ => Ok(()),
    }
}

fn is_segment(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("events-") && name.ends_with(".jsonl"))
}

fn open_segment(dir: &Path, first_seq: u64) -> Result<(Segment, File), SpoolError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = dir.join(format!("events-{first_seq:020}.jsonl"));
    let open = || {
        std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&path)
    };
    let file = match open() {
        // The directory was deleted under the spool: made again.
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_err(dir))?;
            open()
        }
        opened => opened,
    }
    .map_err(io_err(&path))?;
    Ok((Segment { first_seq, last_seq: 0, path, bytes: 0 }, file))
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

mod reader;
pub use reader::SpoolReader;
#[cfg(test)]
use reader::line_seq;

#[cfg(test)]
mod tests;
