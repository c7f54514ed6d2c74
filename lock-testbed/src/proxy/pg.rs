//! PostgreSQL's framing, client to server, as far as the proxy needs it: the statements
//! sent.
//!
//! A connection opens with untyped messages (a length, then a code: the start-up message,
//! or an SSL, GSS or cancel request before it); after the start-up message every message is
//! a type byte and a length that counts itself. A statement's text comes in a simple
//! `Query` (`Q`, run at once) or an extended-protocol `Parse` (`P`, run by the `Execute`
//! that tokio-postgres sends in the same flight). Plain connections only: after an
//! accepted SSL request the bytes are TLS records, which this does not read.

/// The protocol 3.0 start-up message's code.
const STARTUP_V3: u32 = 196_608;
/// How much of a statement's text is kept to match against.
const TEXT_CAP: usize = 4096;

/// Reads the client's messages as they pass, chunk by chunk.
#[derive(Debug, Default)]
pub(crate) struct PgRequests {
    /// The start-up message went by: messages are typed.
    started: bool,
    /// The header read so far (5 bytes typed, 8 untyped).
    head: Vec<u8>,
    /// Body bytes of the current message still to pass.
    skip: u64,
    /// The text of the statement whose body is passing (a `Q` or `P`).
    text: Option<Vec<u8>>,
    /// The framing made no sense: read nothing more.
    lost: bool,
}

impl PgRequests {
    /// Reads `data`, adding the text of each statement whose message ends in it to
    /// `statements` (at most its first 4 KiB, lossily decoded; a `Parse` with the
    /// statement's name before it).
    pub(crate) fn feed(&mut self, mut data: &[u8], statements: &mut Vec<String>) {
        while !data.is_empty() && !self.lost {
            if self.skip > 0 {
                let n = usize::try_from(self.skip)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                if let Some(text) = &mut self.text {
                    let room = TEXT_CAP.saturating_sub(text.len()).min(n);
                    text.extend_from_slice(&data[..room]);
                }
                self.skip -= n as u64;
                data = &data[n..];
                self.end_of_body(statements);
                continue;
            }
            let want = if self.started { 5 } else { 8 };
            let n = (want - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.head.len() < want {
                break;
            }
            self.finish_head();
            self.head.clear();
            self.end_of_body(statements);
        }
    }

    /// A whole header is read: note what it says.
    fn finish_head(&mut self) {
        let word = |at: usize| {
            u32::from_be_bytes([
                self.head[at],
                self.head[at + 1],
                self.head[at + 2],
                self.head[at + 3],
            ])
        };
        if self.started {
            let length = word(1);
            self.lost = length < 4;
            self.skip = u64::from(length.saturating_sub(4));
            self.text = matches!(self.head[0], b'Q' | b'P').then(Vec::new);
            return;
        }
        let (length, code) = (word(0), word(4));
        self.lost = length < 8;
        self.skip = u64::from(length.saturating_sub(8));
        self.started = code == STARTUP_V3;
    }

    /// Hands on the statement's text once its message's body has passed.
    fn end_of_body(&mut self, statements: &mut Vec<String>) {
        if self.skip == 0
            && let Some(text) = self.text.take()
        {
            statements.push(String::from_utf8_lossy(&text).into_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn untyped(code: u32, body: &[u8]) -> Vec<u8> {
        let length = u32::try_from(8 + body.len()).unwrap();
        let mut message = length.to_be_bytes().to_vec();
        message.extend_from_slice(&code.to_be_bytes());
        message.extend_from_slice(body);
        message
    }

    fn typed(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut message = vec![kind];
        message.extend_from_slice(&u32::try_from(4 + body.len()).unwrap().to_be_bytes());
        message.extend_from_slice(body);
        message
    }

    /// A start-up after a refused SSL request, then one statement in tokio-postgres's
    /// single flight (Parse, Bind, Describe, Execute, Sync); the offset where the Parse
    /// ends.
    fn session() -> (Vec<u8>, usize) {
        let mut stream = untyped(80_877_103, b""); // an SSL request, refused
        stream.extend(untyped(STARTUP_V3, b"user\0postgres\0\0"));
        stream.extend(typed(b'P', b"\0SELECT pg_advisory_lock(1)\0\0\0"));
        let parse_end = stream.len();
        stream.extend(typed(b'B', b"\0\0\0\0\0\0\0\0"));
        stream.extend(typed(b'D', b"P\0"));
        stream.extend(typed(b'E', b"\0\0\0\0\0"));
        stream.extend(typed(b'S', b""));
        (stream, parse_end)
    }

    fn statements(requests: &mut PgRequests, data: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        requests.feed(data, &mut out);
        out
    }

    #[test]
    fn a_statement_is_seen_in_the_chunk_it_ends_in_however_the_stream_is_cut() {
        let (stream, parse_end) = session();
        let text = "\0SELECT pg_advisory_lock(1)\0\0\0";
        for cut in 1..stream.len() {
            let mut requests = PgRequests::default();
            let (first, second) = stream.split_at(cut);
            let seen = (
                statements(&mut requests, first),
                statements(&mut requests, second),
            );
            let (before, after) = if cut >= parse_end {
                (vec![text.to_owned()], vec![])
            } else {
                (vec![], vec![text.to_owned()])
            };
            assert_eq!(seen, (before, after), "cut at {cut}");
        }
        let mut requests = PgRequests::default();
        let seen: Vec<usize> = (0..stream.len())
            .filter(|&at| !statements(&mut requests, &stream[at..=at]).is_empty())
            .collect();
        assert_eq!(seen, [parse_end - 1]);
    }

    #[test]
    fn a_simple_query_is_seen_and_nothing_before_the_start_up() {
        let mut requests = PgRequests::default();
        assert!(statements(&mut requests, &untyped(STARTUP_V3, b"user\0Q\0\0")).is_empty());
        let both = [typed(b'Q', b"SELECT 1\0"), typed(b'Q', b"")].concat();
        assert_eq!(statements(&mut requests, &both), ["SELECT 1\0", ""]);
        assert!(statements(&mut requests, &typed(b'X', b"")).is_empty());
    }

    #[test]
    fn a_long_statement_is_cut_to_its_start_and_nonsense_stops_the_reading() {
        let mut requests = PgRequests::default();
        statements(&mut requests, &untyped(STARTUP_V3, b""));
        let long = vec![b'x'; 3 * TEXT_CAP];
        let seen = statements(&mut requests, &typed(b'Q', &long));
        assert_eq!(seen.iter().map(String::len).collect::<Vec<_>>(), [TEXT_CAP]);
        let mut requests = PgRequests::default();
        statements(&mut requests, &[0, 0, 0, 1, 0, 0, 0, 0]);
        assert!(statements(&mut requests, &typed(b'Q', b"SELECT 1\0")).is_empty());
    }
}
