//! The agent's last stderr lines, each with when it came: the cause of the agent's death
//! is its exit status, then only what it printed in its last seconds. A start-up banner, or
//! debug lines printed minutes before (claude prints a dozen at every resume), are not
//! the cause and are left out.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long before its exit a line may have come to be part of the cause.
pub const RECENT: Duration = Duration::from_secs(5);
/// The most lines kept.
pub const MAX_LINES: usize = 12;
/// The most bytes kept (a long line takes the room of several).
pub const MAX_BYTES: usize = 4096;

/// The newest stderr lines, bounded by [`MAX_LINES`] and [`MAX_BYTES`].
#[derive(Debug, Default)]
pub struct StderrTail {
    lines: VecDeque<(Instant, String)>,
    bytes: usize,
}

impl StderrTail {
    /// A line the agent printed at `at`.
    pub fn push(&mut self, at: Instant, line: String) {
        self.bytes += line.len();
        self.lines.push_back((at, line));
        while self.lines.len() > MAX_LINES || (self.bytes > MAX_BYTES && self.lines.len() > 1) {
            if let Some((_, gone)) = self.lines.pop_front() {
                self.bytes -= gone.len();
            }
        }
    }

    /// The lines printed within [`RECENT`] before `exit`, one per line.
    pub fn before(&self, exit: Instant) -> String {
        let since = exit.checked_sub(RECENT);
        let recent = self.lines.iter().filter(|(at, _)| since.is_none_or(|since| *at >= since));
        let mut text = String::new();
        for (_, line) in recent {
            text.push_str(line);
            text.push('\n');
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_came_in_the_last_seconds_is_the_cause_and_it_is_bounded() {
        let start = Instant::now();
        let mut tail = StderrTail::default();
        for n in 0..17 {
            tail.push(start, format!("debug line {n}"));
        }
        let exit = start + Duration::from_secs(60);
        tail.push(exit - Duration::from_secs(1), "fatal: out of tokens".into());
        assert_eq!(tail.before(exit), "fatal: out of tokens\n", "the stale ones are left out");
        // Right after a start, every kept line is recent, and no more than MAX_LINES: the
        // newest ones.
        let soon = start + Duration::from_secs(1);
        let kept = tail.before(soon);
        assert_eq!(kept.lines().count(), MAX_LINES, "{kept}");
        assert!(kept.starts_with("debug line 6\n"), "the oldest went: {kept}");
        // Long lines: bounded by bytes.
        let mut long = StderrTail::default();
        for _ in 0..5 {
            long.push(start, "x".repeat(3000));
        }
        assert_eq!(long.before(start).len(), 3001, "one long line fits");
    }
}
