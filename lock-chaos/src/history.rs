//! What the clients did: one [`Event`] per operation, with its start and end on one clock
//! shared by every process of the run, its fencing token and its outcome. A client writes
//! its events as JSON lines; the checker reads them all.

use serde::{Deserialize, Serialize};

/// What an operation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// An acquire of the lock; `token` is the grant's fencing token.
    Acquire,
    /// A read of the register; `value` is what it held.
    Read,
    /// A write of the register with `token`, setting `value`.
    Write,
    /// A release of the guard with `token`.
    Release,
    /// The lost signal of the guard with `token` fired (start and end are that moment).
    Lost,
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "detail")]
#[non_exhaustive]
pub enum Outcome {
    /// Done: the lock granted or released, the read answered, the write accepted.
    Ok,
    /// A write the register turned away as stale.
    Rejected,
    /// Not done, for sure (a timeout, a refused request), and why.
    Failed(String),
    /// Perhaps done, perhaps not (the connection failed before the reply), and why.
    Unknown(String),
}

/// One operation of one client.
///
/// ```
/// use lock_chaos::{Event, EventKind, Outcome};
///
/// let event = Event::new(3, EventKind::Acquire, 1_000, 2_500, Outcome::Ok).with_token(42);
/// let line = event.to_line();
/// assert_eq!(lock_chaos::history::parse_lines(&line).unwrap(), vec![event]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Event {
    /// The client (one OS process of the run, or one task for the memory backend).
    pub client: u32,
    /// What it did.
    pub kind: EventKind,
    /// When it began, in nanoseconds on the run's clock.
    pub start_ns: u64,
    /// When it ended (for [`EventKind::Lost`], the same as the start).
    pub end_ns: u64,
    /// The fencing token it concerns, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The register value it read or wrote, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl Event {
    /// An event without token or value.
    pub fn new(client: u32, kind: EventKind, start_ns: u64, end_ns: u64, outcome: Outcome) -> Self {
        Event {
            client,
            kind,
            start_ns,
            end_ns,
            token: None,
            value: None,
            outcome,
        }
    }

    /// The same event about `token`.
    #[must_use]
    pub fn with_token(mut self, token: u64) -> Self {
        self.token = Some(token);
        self
    }

    /// The same event with the register value `value`.
    #[must_use]
    pub fn with_value(mut self, value: u64) -> Self {
        self.value = Some(value);
        self
    }

    /// The event as one line of JSON, newline included.
    pub fn to_line(&self) -> String {
        // Serialising this plain struct cannot fail; an empty object keeps the line count.
        let mut line = serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned());
        line.push('\n');
        line
    }

    /// Whether the operation ended with [`Outcome::Ok`].
    pub fn is_ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }
}

/// Reads events from JSON lines, skipping blank lines.
///
/// # Errors
///
/// The first line that is not an event, with its number (from 1).
pub fn parse_lines(text: &str) -> Result<Vec<Event>, (usize, serde_json::Error)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| serde_json::from_str(line).map_err(|error| (index + 1, error)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_survives_a_round_trip() {
        let events = vec![
            Event::new(1, EventKind::Acquire, 1, 2, Outcome::Ok).with_token(7),
            Event::new(1, EventKind::Read, 3, 4, Outcome::Ok).with_value(10),
            Event::new(1, EventKind::Write, 5, 6, Outcome::Rejected)
                .with_token(7)
                .with_value(11),
            Event::new(
                2,
                EventKind::Acquire,
                1,
                9,
                Outcome::Failed("timeout".into()),
            ),
            Event::new(
                1,
                EventKind::Release,
                7,
                8,
                Outcome::Unknown("reset".into()),
            )
            .with_token(7),
            Event::new(1, EventKind::Lost, 8, 8, Outcome::Ok).with_token(7),
        ];
        let text: String = events.iter().map(Event::to_line).collect();
        assert_eq!(text.lines().count(), events.len());
        assert_eq!(parse_lines(&text).unwrap(), events);
    }

    #[test]
    fn a_bad_line_is_named() {
        let good = Event::new(1, EventKind::Lost, 8, 8, Outcome::Ok).to_line();
        let (line, _) = parse_lines(&format!("{good}\nnot json\n")).unwrap_err();
        assert_eq!(line, 3);
    }
}
