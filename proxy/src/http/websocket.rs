//! WebSocket framing, as far as a relay needs it (RFC 6455 §5.2): where a
//! server's stream stands as it passes, and a close frame of the proxy's
//! own. The proxy relays a live tail's frames untouched; to end a tail
//! (its credential revoked, the proxy shutting down) with a close frame
//! rather than a cut connection, it may write that frame only between two
//! of the server's (§5.4: a control frame may come between the fragments
//! of a message, never inside a frame).

/// The longest frame header: two bytes, a 64-bit length, a masking key.
const LONGEST_HEADER: usize = 2 + 8 + 4;

const OPCODE_CLOSE: u8 = 0x8;

/// Reads frame headers and skips payloads, across any split of the bytes.
#[derive(Debug)]
pub struct FrameBoundary {
    state: State,
    /// The server has sent a close frame (its header at least): the
    /// proxy must not send a second one.
    server_closed: bool,
}

#[derive(Debug)]
enum State {
    /// Within a header, `have` bytes of it read (0: at a boundary).
    Header {
        have: usize,
        bytes: [u8; LONGEST_HEADER],
    },
    /// Within a payload, `left` bytes still to come.
    Payload { left: u64 },
}

impl Default for FrameBoundary {
    fn default() -> Self {
        Self {
            state: State::at_boundary(),
            server_closed: false,
        }
    }
}

impl State {
    fn at_boundary() -> Self {
        State::Header {
            have: 0,
            bytes: [0; LONGEST_HEADER],
        }
    }
}

impl FrameBoundary {
    /// Takes in the next bytes the client was sent.
    pub fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let taken = self.advance_to_frame_end(bytes);
            bytes = &bytes[taken..];
        }
    }

    /// Takes in `bytes` up to the end of the frame under way (at a
    /// boundary: the next one), or all of them if it does not end within;
    /// returns how many it took.
    pub fn advance_to_frame_end(&mut self, bytes: &[u8]) -> usize {
        let mut taken = 0;
        while taken < bytes.len() {
            match &mut self.state {
                State::Payload { left } => {
                    let step =
                        (bytes.len() - taken).min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= step as u64;
                    taken += step;
                    if *left == 0 {
                        self.state = State::at_boundary();
                        break;
                    }
                }
                State::Header {
                    have,
                    bytes: header,
                } => {
                    header[*have] = bytes[taken];
                    *have += 1;
                    taken += 1;
                    if let Some(payload) = payload_length(&header[..*have]) {
                        if header[0] & 0x0f == OPCODE_CLOSE {
                            self.server_closed = true;
                        }
                        if payload == 0 {
                            self.state = State::at_boundary();
                            break;
                        }
                        self.state = State::Payload { left: payload };
                    }
                }
            }
        }
        taken
    }

    /// Whether the bytes so far end a frame.
    pub fn at_boundary(&self) -> bool {
        matches!(self.state, State::Header { have: 0, .. })
    }

    /// Whether the server sent a close frame (its header at least): the
    /// stream is ending, and a second close frame must not follow.
    pub fn server_closed(&self) -> bool {
        self.server_closed
    }

    /// Whether a close frame of the proxy's own may be written now.
    pub fn may_close(&self) -> bool {
        self.at_boundary() && !self.server_closed
    }
}

/// The payload length once `header` holds a whole frame header, else
/// `None` (more bytes needed).
fn payload_length(header: &[u8]) -> Option<u64> {
    let [_, second, rest @ ..] = header else {
        return None;
    };
    let masking_key = if second & 0x80 != 0 { 4 } else { 0 };
    let (extended, short) = match second & 0x7f {
        126 => (2, None),
        127 => (8, None),
        short => (0, Some(u64::from(short))),
    };
    if rest.len() < extended + masking_key {
        return None;
    }
    Some(short.unwrap_or_else(|| {
        rest[..extended]
            .iter()
            .fold(0, |length, &byte| length << 8 | u64::from(byte))
    }))
}

/// Why the proxy ends a stream, as a close frame's status and reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Close {
    /// 1008 "policy violation": the credential no longer grants the tail.
    CredentialRevoked,
    /// 1001 "going away": the proxy is shutting down; a reconnect goes to
    /// another replica.
    ShuttingDown,
}

impl Close {
    fn status(self) -> u16 {
        match self {
            Close::CredentialRevoked => 1008,
            Close::ShuttingDown => 1001,
        }
    }

    /// Short ASCII: a control frame's payload is at most 125 bytes.
    pub fn reason(self) -> &'static str {
        match self {
            Close::CredentialRevoked => "credential revoked",
            Close::ShuttingDown => "proxy shutting down",
        }
    }

    /// The close frame as a server sends it (unmasked).
    pub fn frame(self) -> Vec<u8> {
        let reason = self.reason().as_bytes();
        let mut frame = vec![0x80 | OPCODE_CLOSE, 2 + reason.len() as u8];
        frame.extend_from_slice(&self.status().to_be_bytes());
        frame.extend_from_slice(reason);
        frame
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A frame as a server writes it (a client's, masked, when `mask`).
    fn frame(opcode: u8, payload_len: usize, mask: bool) -> Vec<u8> {
        let mask_bit = if mask { 0x80 } else { 0 };
        let mut bytes = vec![0x80 | opcode];
        match payload_len {
            0..=125 => bytes.push(mask_bit | payload_len as u8),
            126..=0xffff => {
                bytes.push(mask_bit | 126);
                bytes.extend_from_slice(&(payload_len as u16).to_be_bytes());
            }
            _ => {
                bytes.push(mask_bit | 127);
                bytes.extend_from_slice(&(payload_len as u64).to_be_bytes());
            }
        }
        if mask {
            bytes.extend_from_slice(&[1, 2, 3, 4]);
        }
        bytes.extend((0..payload_len).map(|i| i as u8));
        bytes
    }

    #[test]
    fn close_frames_carry_their_status_and_reason() {
        let revoked = Close::CredentialRevoked.frame();
        assert_eq!(&revoked[..4], &[0x88, 20, 0x03, 0xf0]);
        assert_eq!(&revoked[4..], b"credential revoked");
        let going_away = Close::ShuttingDown.frame();
        assert_eq!(&going_away[..4], &[0x88, 21, 0x03, 0xe9]);
        for close in [Close::CredentialRevoked, Close::ShuttingDown] {
            let frame = close.frame();
            assert!(
                frame[1] <= 125,
                "a control frame's payload is 125 bytes at most"
            );
            let mut after = FrameBoundary::default();
            after.advance(&frame);
            assert!(!after.may_close(), "one close frame, not two");
        }
    }

    fn payload_lengths() -> impl Strategy<Value = usize> {
        prop_oneof![
            0..=2usize,
            124..=127usize,
            65_534..=65_537usize,
            0..300usize
        ]
    }

    proptest! {
        /// Split anywhere, the stream is at a boundary exactly where a
        /// frame ends, and a close frame from the server ends the right to
        /// send one.
        #[test]
        fn boundaries_are_found_wherever_the_bytes_are_split(
            frames in proptest::collection::vec(
                (prop_oneof![Just(0x0u8), Just(0x1), Just(0x2), Just(0x9), Just(0xa)],
                 payload_lengths(), any::<bool>()),
                1..6),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
            close_last in any::<bool>(),
        ) {
            let mut stream = Vec::new();
            let mut ends = vec![0]; // the start is a boundary too
            for (opcode, len, mask) in &frames {
                stream.extend(frame(*opcode, *len, *mask));
                ends.push(stream.len());
            }
            if close_last {
                stream.extend(frame(OPCODE_CLOSE, 2, false));
                ends.push(stream.len());
            }
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
            cuts.extend(ends.iter().copied());
            cuts.push(stream.len());
            cuts.sort_unstable();
            cuts.dedup();
            // Taken a frame at a time, each step ends exactly at a frame's end.
            let mut framewise = FrameBoundary::default();
            let mut at = 0;
            for &end in &ends[1..] {
                at += framewise.advance_to_frame_end(&stream[at..]);
                prop_assert_eq!(at, end);
                prop_assert!(framewise.at_boundary());
            }
            let mut boundary = FrameBoundary::default();
            let mut at = 0;
            for cut in cuts {
                boundary.advance(&stream[at..cut]);
                at = cut;
                let closed = close_last && at == stream.len();
                prop_assert_eq!(boundary.may_close(), ends.contains(&at) && !closed, "at byte {}", at);
            }
        }
    }
}
