//! A streaming, allocation-free reader of ZooKeeper frame headers.
//!
//! Every ZooKeeper frame is a 4-byte big-endian length followed by that many body bytes. The
//! first frame each way is the connect handshake; after it, a request body starts with
//! `xid: i32, op: i32` and a reply body with `xid: i32, zxid: i64, err: i32`. The parser only
//! keeps the first few body bytes of each frame and counts its way over the rest, so frames
//! split across reads, several frames in one read and large frames all cost the same.

/// Op codes that create nodes (create, multi, create2, createContainer, createTTL).
const CREATE_OPS: [i32; 5] = [1, 14, 15, 19, 21];

/// The op code of delete.
const DELETE_OP: i32 = 2;

/// Whether a request op code may create a node.
pub(crate) fn is_create_op(op: i32) -> bool {
    CREATE_OPS.contains(&op)
}

/// Whether a request op code is a delete.
pub(crate) fn is_delete_op(op: i32) -> bool {
    op == DELETE_OP
}

/// How many body bytes of a request frame make its header (xid, op).
pub(crate) const REQUEST_HEAD: usize = 8;
/// How many body bytes of a reply frame make its header (xid, zxid, err).
pub(crate) const REPLY_HEAD: usize = 16;

/// The start of one frame after the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHead {
    /// Absolute stream offset of the frame's length prefix.
    pub(crate) start: u64,
    /// The first body bytes (as many as the parser was asked to keep).
    head: [u8; REPLY_HEAD],
}

impl FrameHead {
    fn i32_at(&self, at: usize) -> i32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.head[at..at + 4]);
        i32::from_be_bytes(b)
    }

    /// `(xid, op)` of a request frame.
    pub(crate) fn request(&self) -> (i32, i32) {
        (self.i32_at(0), self.i32_at(4))
    }

    /// `(xid, zxid, err)` of a reply frame (only meaningful for a parser keeping 16 bytes).
    pub(crate) fn reply(&self) -> (i32, i64, i32) {
        let mut z = [0u8; 8];
        z.copy_from_slice(&self.head[4..12]);
        (self.i32_at(0), i64::from_be_bytes(z), self.i32_at(12))
    }
}

/// The most bytes a frame's header takes: the length prefix and a reply's head.
const MAX_HEADER: usize = 4 + REPLY_HEAD;

/// Reads frame headers out of one direction of a ZooKeeper stream.
#[derive(Debug, Clone)]
pub(crate) struct FrameParser {
    /// How many body bytes make a header for this direction (at most [`REPLY_HEAD`]).
    want: usize,
    /// Absolute offset of the next byte fed.
    offset: u64,
    /// Frames completed so far (the first one is the handshake).
    frames: u64,
    /// Where the frame being read starts.
    frame_start: u64,
    /// Its header read so far: the length prefix, then up to `want` body bytes.
    header: [u8; MAX_HEADER],
    got: usize,
    /// Body bytes still to pass over after the header.
    skip: u64,
    /// A negative length was seen: the stream is not ZooKeeper (or is corrupt).
    desynced: bool,
}

impl FrameParser {
    /// A parser keeping `want` (at most 16) body bytes of each frame.
    pub(crate) fn new(want: usize) -> Self {
        Self {
            want: want.min(REPLY_HEAD),
            offset: 0,
            frames: 0,
            frame_start: 0,
            header: [0; MAX_HEADER],
            got: 0,
            skip: 0,
            desynced: false,
        }
    }

    /// Whether a negative length made the parser give up on this stream.
    #[cfg(test)]
    pub(crate) fn is_desynced(&self) -> bool {
        self.desynced
    }

    /// If the parser is inside a frame whose header is not complete yet, the absolute offset
    /// where that frame starts.
    pub(crate) fn partial_head_start(&self) -> Option<u64> {
        (self.got > 0).then_some(self.frame_start)
    }

    /// Feeds the next bytes of the stream; pushes one [`FrameHead`] per completed header of a
    /// frame after the handshake whose body holds at least `want` bytes.
    pub(crate) fn feed(&mut self, data: &[u8], out: &mut Vec<FrameHead>) {
        let mut rest = data;
        while !rest.is_empty() && !self.desynced {
            if self.skip > 0 {
                let take =
                    usize::try_from(self.skip).map_or(rest.len(), |skip| skip.min(rest.len()));
                self.skip -= take as u64;
                rest = &rest[take..];
                if self.skip == 0 {
                    self.frames += 1;
                }
                continue;
            }
            if self.got == 0 {
                self.frame_start = self.offset + (data.len() - rest.len()) as u64;
            }
            let take = (self.header_len() - self.got).min(rest.len());
            self.header[self.got..self.got + take].copy_from_slice(&rest[..take]);
            self.got += take;
            rest = &rest[take..];
            if self.got == 4 && self.body_len().is_none() {
                tracing::debug!("negative frame length; no longer parsing");
                self.desynced = true;
            } else if self.got == self.header_len() {
                self.end_header(out);
            }
        }
        self.offset += data.len() as u64;
    }

    /// The body's length, once the length prefix is read (`None` while it is not, or when
    /// it is negative).
    fn body_len(&self) -> Option<u64> {
        let prefix = self.header.first_chunk::<4>().filter(|_| self.got >= 4)?;
        u64::try_from(i32::from_be_bytes(*prefix)).ok()
    }

    /// How many bytes this frame's header takes: 4 until the length is known, then as many
    /// body bytes as the body has, up to `want`.
    fn header_len(&self) -> usize {
        let body = self.body_len().map_or(0, |len| len.min(self.want as u64));
        4 + usize::try_from(body).unwrap_or(0)
    }

    fn end_header(&mut self, out: &mut Vec<FrameHead>) {
        let kept = self.got - 4;
        if self.frames > 0 && kept == self.want && self.want > 0 {
            let mut head = [0; REPLY_HEAD];
            head.copy_from_slice(&self.header[4..]);
            out.push(FrameHead {
                start: self.frame_start,
                head,
            });
        }
        self.skip = self.body_len().unwrap_or(0) - kept as u64;
        self.header = [0; MAX_HEADER];
        self.got = 0;
        if self.skip == 0 {
            self.frames += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as i32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    fn request(xid: i32, op: i32, extra: usize) -> Vec<u8> {
        let mut b = xid.to_be_bytes().to_vec();
        b.extend_from_slice(&op.to_be_bytes());
        b.extend(std::iter::repeat_n(0xAB, extra));
        frame(&b)
    }

    fn reply(xid: i32, zxid: i64, err: i32, extra: usize) -> Vec<u8> {
        let mut b = xid.to_be_bytes().to_vec();
        b.extend_from_slice(&zxid.to_be_bytes());
        b.extend_from_slice(&err.to_be_bytes());
        b.extend(std::iter::repeat_n(0xCD, extra));
        frame(&b)
    }

    /// The stream of a session: handshake, ping, getData, notification-free create.
    fn request_stream() -> (Vec<u8>, Vec<(u64, i32, i32)>) {
        let mut s = frame(&[7u8; 45]);
        let mut want = Vec::new();
        for (xid, op, extra) in [(-2, 11, 0), (1, 4, 9), (2, 1, 300), (3, 8, 0)] {
            want.push((s.len() as u64, xid, op));
            s.extend(request(xid, op, extra));
        }
        (s, want)
    }

    fn parse_in_pieces(stream: &[u8], cuts: &[usize], want: usize) -> Vec<FrameHead> {
        let mut p = FrameParser::new(want);
        let mut out = Vec::new();
        let mut last = 0;
        for &c in cuts.iter().chain(std::iter::once(&stream.len())) {
            p.feed(&stream[last..c], &mut out);
            last = c;
        }
        out
    }

    #[test]
    fn requests_whole_and_split_at_every_byte() {
        let (s, want) = request_stream();
        let got = |heads: Vec<FrameHead>| -> Vec<(u64, i32, i32)> {
            heads
                .iter()
                .map(|h| {
                    let (xid, op) = h.request();
                    (h.start, xid, op)
                })
                .collect()
        };
        assert_eq!(got(parse_in_pieces(&s, &[], REQUEST_HEAD)), want);
        for cut in 1..s.len() {
            assert_eq!(
                got(parse_in_pieces(&s, &[cut], REQUEST_HEAD)),
                want,
                "cut {cut}"
            );
        }
        let every: Vec<usize> = (1..s.len()).collect();
        assert_eq!(got(parse_in_pieces(&s, &every, REQUEST_HEAD)), want);
    }

    #[test]
    fn replies_with_notification_and_ping() {
        let mut s = frame(&[1u8; 36]);
        s.extend(reply(-2, 5, 0, 0));
        s.extend(reply(-1, -1, 0, 40));
        s.extend(reply(7, 99, -110, 12));
        let heads = parse_in_pieces(&s, &[3, 41, 42, 60], REPLY_HEAD);
        let r: Vec<_> = heads.iter().map(FrameHead::reply).collect();
        assert_eq!(r, vec![(-2, 5, 0), (-1, -1, 0), (7, 99, -110)]);
    }

    #[test]
    fn partial_head_is_reported() {
        let mut s = frame(&[1u8; 4]);
        let first = s.len() as u64;
        s.extend(reply(3, 1, 0, 5));
        let mut p = FrameParser::new(REPLY_HEAD);
        let mut out = Vec::new();
        p.feed(&s[..first as usize + 2], &mut out);
        assert_eq!(p.partial_head_start(), Some(first));
        p.feed(&s[first as usize + 2..first as usize + 10], &mut out);
        assert_eq!(p.partial_head_start(), Some(first));
        assert!(out.is_empty());
        p.feed(&s[first as usize + 10..first as usize + 21], &mut out);
        assert_eq!(p.partial_head_start(), None);
        assert_eq!(out.len(), 1);
        p.feed(&s[first as usize + 21..], &mut out);
        assert_eq!(p.partial_head_start(), None);
    }

    #[test]
    fn short_and_negative_frames() {
        let mut s = frame(&[0u8; 2]); // handshake
        s.extend(frame(&[1, 2, 3])); // too short for a header: no event
        s.extend(frame(&[])); // empty
        s.extend(request(4, 1, 0));
        s.extend((-5i32).to_be_bytes());
        s.extend(request(5, 1, 0)); // after desync: ignored
        let mut p = FrameParser::new(REQUEST_HEAD);
        let mut out = Vec::new();
        p.feed(&s, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].request(), (4, 1));
        assert!(p.is_desynced());
    }

    #[test]
    fn create_ops() {
        for op in [1, 14, 15, 19, 21] {
            assert!(is_create_op(op));
        }
        for op in [2, 3, 4, 8, 11, 12] {
            assert!(!is_create_op(op));
        }
    }
}
