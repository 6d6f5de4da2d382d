//! Reading an upstream's HTTP/1.1 answer to a bodiless `GET`, without I/O:
//! bytes go in, the head, the body's pieces and the answer's end come out
//! (sans-IO, so that every split of the bytes can be tested and fuzzed).
//!
//! Why it is strict: the connection the answer came on carries the next
//! request next, possibly another tenant's. Misread where an answer ends,
//! and the rest of it becomes the start of the next one. So whatever this
//! reader does not fully understand is refused (the request gets 502), and
//! a connection is offered for reuse only when the answer was framed by a
//! length or by chunks, ended exactly where the bytes ended, and did not
//! say `close` (RFC 9112 §6.3, §9.3).

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};

use crate::http::headers::{self, elements};

/// A head longer than this is refused (Go's servers send a few hundred
/// bytes).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Header fields in one head, at most (hyper's limit too).
const MAX_HEADERS: usize = 100;
/// Informational answers (`100`, `103`) skipped before the final one.
const MAX_INFORMATIONAL: usize = 8;
/// A chunk's size line, extensions included.
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// All trailer fields together (read and dropped), in bytes (their line
/// ends included) and in fields: half of hyper's limits (16 KiB, 100
/// fields).
const MAX_TRAILER_BYTES: usize = 8 * 1024;
const MAX_TRAILERS: usize = 50;

/// Why an answer was refused. Each ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("the upstream closed the connection before answering")]
    ClosedBeforeAnswer,
    #[error("the upstream closed the connection in the middle of its answer")]
    ClosedEarly,
    #[error("the upstream's answer head is malformed")]
    MalformedHead,
    #[error("the upstream's answer head is longer than {MAX_HEAD_BYTES} bytes or has more than {MAX_HEADERS} fields")]
    HeadTooLarge,
    #[error("the upstream switched protocols unasked, or sent too many informational answers")]
    UnexpectedStatus,
    #[error("the upstream's answer has a Transfer-Encoding other than chunked alone, or one beside a Content-Length or on a 204")]
    UnsupportedFraming,
    #[error("the upstream's answer has an invalid or conflicting Content-Length")]
    BadContentLength,
    #[error("the upstream's chunked answer is malformed")]
    BadChunk,
}

/// What the reader found next.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// The final answer's head (informational ones are skipped).
    Head(Head),
    /// A piece of the body, as it arrived.
    Data(Bytes),
    /// The answer is complete. `reusable`: the connection may carry
    /// another request.
    End { reusable: bool },
}

#[derive(Debug, PartialEq)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
}

enum State {
    Head { informational: usize },
    Length { remaining: u64 },
    Chunked(Chunk),
    UntilClose,
    Done,
}

enum Chunk {
    Size,
    Data { remaining: u64 },
    DataEnd,
    Trailers { seen: usize, fields: usize },
}

/// Reads one answer. Feed it the connection's buffer after every read.
pub struct AnswerReader {
    state: State,
    keep_alive: bool,
}

impl Default for AnswerReader {
    fn default() -> Self {
        Self::new()
    }
}

impl AnswerReader {
    pub fn new() -> Self {
        Self {
            state: State::Head { informational: 0 },
            keep_alive: false,
        }
    }

    /// The next event, taking what it read from `buf`; `Ok(None)` when it
    /// needs more bytes. `closed`: the upstream has closed its side, so no
    /// more bytes will come. After an error or the end, read no further.
    pub fn next(&mut self, buf: &mut BytesMut, closed: bool) -> Result<Option<Event>, AnswerError> {
        loop {
            match self.state {
                State::Head { informational } => match read_head(buf, closed)? {
                    None => return Ok(None),
                    Some(Parsed::Informational) if informational < MAX_INFORMATIONAL => {
                        self.state = State::Head {
                            informational: informational + 1,
                        };
                    }
                    Some(Parsed::Informational) => return Err(AnswerError::UnexpectedStatus),
                    Some(Parsed::Final(head, framing)) => {
                        self.keep_alive = keeps_alive(&head);
                        self.state = match framing {
                            Framing::Length(length) => State::Length { remaining: length },
                            Framing::Chunked => State::Chunked(Chunk::Size),
                            Framing::UntilClose => State::UntilClose,
                        };
                        return Ok(Some(Event::Head(head)));
                    }
                },
                State::Length { remaining } => {
                    if remaining == 0 {
                        return Ok(Some(self.end(buf)));
                    }
                    let Some(data) = take_data(buf, remaining, closed)? else {
                        return Ok(None);
                    };
                    self.state = State::Length {
                        remaining: remaining - data.len() as u64,
                    };
                    return Ok(Some(Event::Data(data)));
                }
                State::UntilClose => {
                    if !buf.is_empty() {
                        return Ok(Some(Event::Data(buf.split().freeze())));
                    }
                    if !closed {
                        return Ok(None);
                    }
                    self.keep_alive = false;
                    return Ok(Some(self.end(buf)));
                }
                State::Chunked(Chunk::Size) => {
                    let Some(line) = take_line(buf, MAX_CHUNK_LINE, closed)? else {
                        return Ok(None);
                    };
                    self.state = match chunk_size(&line)? {
                        0 => State::Chunked(Chunk::Trailers { seen: 0, fields: 0 }),
                        size => State::Chunked(Chunk::Data { remaining: size }),
                    };
                }
                State::Chunked(Chunk::Data { remaining }) => {
                    let Some(data) = take_data(buf, remaining, closed)? else {
                        return Ok(None);
                    };
                    let remaining = remaining - data.len() as u64;
                    self.state = State::Chunked(match remaining {
                        0 => Chunk::DataEnd,
                        _ => Chunk::Data { remaining },
                    });
                    return Ok(Some(Event::Data(data)));
                }
                State::Chunked(Chunk::DataEnd) => {
                    if buf.len() < 2 {
                        return match closed {
                            true => Err(AnswerError::ClosedEarly),
                            false => Ok(None),
                        };
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(AnswerError::BadChunk);
                    }
                    buf.advance(2);
                    self.state = State::Chunked(Chunk::Size);
                }
                State::Chunked(Chunk::Trailers { seen, fields }) => {
                    // A field's line end counts; the blank line that
                    // ends the trailers does not.
                    let room = MAX_TRAILER_BYTES.saturating_sub(seen + 2);
                    let Some(line) = take_line(buf, room, closed)? else {
                        return Ok(None);
                    };
                    if line.is_empty() {
                        return Ok(Some(self.end(buf)));
                    }
                    // A trailer field: checked for shape, then dropped
                    // (the proxy forwards none).
                    if !is_field_line(&line) || fields == MAX_TRAILERS {
                        return Err(AnswerError::BadChunk);
                    }
                    self.state = State::Chunked(Chunk::Trailers {
                        seen: seen + line.len() + 2,
                        fields: fields + 1,
                    });
                }
                State::Done => return Ok(None),
            }
        }
    }

    /// Whether the body has been read to its announced length: the next
    /// call ends the answer without another byte. A reader that knows the
    /// length (hyper's server, from `Content-Length`) stops there and
    /// never asks for the end.
    pub fn has_read_length(&self) -> bool {
        matches!(self.state, State::Length { remaining: 0 })
    }

    /// The answer is over: reusable if it allowed keep-alive and nothing
    /// followed it.
    fn end(&mut self, buf: &BytesMut) -> Event {
        self.state = State::Done;
        Event::End {
            reusable: self.keep_alive && buf.is_empty(),
        }
    }
}

/// How the body of an answer is delimited.
#[derive(Debug, PartialEq)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

enum Parsed {
    Informational,
    Final(Head, Framing),
}

/// A whole head from the front of `buf`, taken from it; `None` until it
/// is all there.
fn read_head(buf: &mut BytesMut, closed: bool) -> Result<Option<Parsed>, AnswerError> {
    // Left uninitialised: the parser writes each slot it uses (zeroing
    // 100 of them cost more than the parse).
    let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        &mut fields,
    );
    let length = match parsed {
        Ok(httparse::Status::Complete(length)) if length <= MAX_HEAD_BYTES => length,
        Ok(httparse::Status::Complete(_)) | Err(httparse::Error::TooManyHeaders) => {
            return Err(AnswerError::HeadTooLarge)
        }
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => {
            return Err(AnswerError::HeadTooLarge)
        }
        Ok(httparse::Status::Partial) if closed && buf.is_empty() => {
            return Err(AnswerError::ClosedBeforeAnswer)
        }
        Ok(httparse::Status::Partial) if closed => return Err(AnswerError::ClosedEarly),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(AnswerError::MalformedHead),
    };
    let code = response.code.ok_or(AnswerError::MalformedHead)?;
    let status = StatusCode::from_u16(code).map_err(|_| AnswerError::MalformedHead)?;
    let version = match response.version {
        Some(0) => Version::HTTP_10,
        Some(1) => Version::HTTP_11,
        _ => return Err(AnswerError::MalformedHead),
    };
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(AnswerError::UnexpectedStatus); // no upgrade was asked for
    }
    if status.is_informational() {
        buf.advance(length);
        return Ok(Some(Parsed::Informational));
    }
    // The head's bytes, copied once: each value is a slice of the copy.
    let bytes = Bytes::copy_from_slice(&buf[..length]);
    let start = buf.as_ptr() as usize;
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| AnswerError::MalformedHead)?;
        // Where the value sits in the head (httparse hands out slices of
        // it; an empty one may point anywhere).
        let len = field.value.len();
        let at = (field.value.as_ptr() as usize)
            .checked_sub(start)
            .filter(|at| at + len <= length);
        let value = match at {
            _ if len == 0 => HeaderValue::from_static(""),
            Some(at) => HeaderValue::from_maybe_shared(bytes.slice(at..at + len))
                .map_err(|_| AnswerError::MalformedHead)?,
            None => return Err(AnswerError::MalformedHead),
        };
        headers.append(name, value);
    }
    buf.advance(length);
    let framing = framing(status, version, &headers)?;
    Ok(Some(Parsed::Final(
        Head {
            status,
            version,
            headers,
        },
        framing,
    )))
}

/// RFC 9112 §6.3 for an answer to a `GET`, refusing what it allows only
/// with doubt: a `Transfer-Encoding` other than `chunked` alone, one
/// beside a `Content-Length`, in an HTTP/1.0 answer (§6.1: never sent to
/// 1.1 requests) or on a 204 (§6.1: never sent there), and lengths that
/// disagree. These hold for the answers without a body too (204, 304): a
/// sender confused about framing there may send a body all the same, and
/// hyper drops a `Content-Length` beside a `Transfer-Encoding` from the
/// head it hands on, so that the head would read two ways.
fn framing(
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
) -> Result<Framing, AnswerError> {
    let codings = headers.get_all(header::TRANSFER_ENCODING);
    let coded = codings.iter().next().is_some();
    if coded
        && (version != Version::HTTP_11
            || status == StatusCode::NO_CONTENT
            || headers.contains_key(header::CONTENT_LENGTH))
    {
        return Err(AnswerError::UnsupportedFraming);
    }
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        // §6.1 lets a 304 name the coding a 200 would have had.
        return Ok(Framing::Length(0));
    }
    if coded {
        let mut tokens = codings.iter().flat_map(elements);
        let chunked_alone = tokens
            .next()
            .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"))
            && tokens.next().is_none();
        if !chunked_alone {
            return Err(AnswerError::UnsupportedFraming);
        }
        return Ok(Framing::Chunked);
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for token in elements(value) {
            let parsed = decimal(token).ok_or(AnswerError::BadContentLength)?;
            if length.is_some_and(|seen| seen != parsed) {
                return Err(AnswerError::BadContentLength);
            }
            length = Some(parsed);
        }
    }
    Ok(length.map_or(Framing::UntilClose, Framing::Length))
}

/// Whether the connection may carry another request after this answer.
fn keeps_alive(head: &Head) -> bool {
    let says = |option: &[u8]| headers::lists(&head.headers, &header::CONNECTION, option);
    match head.version {
        Version::HTTP_11 => !says(b"close"),
        _ => says(b"keep-alive") && !says(b"close"),
    }
}

/// Digits only, at most 18 of them (no sign, no space, no overflow).
fn decimal(token: &[u8]) -> Option<u64> {
    if token.is_empty() || token.len() > 18 || !token.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(token).ok()?.parse().ok()
}

/// Up to `limit` bytes of body from `buf`; `None` when it is empty.
fn take_data(buf: &mut BytesMut, limit: u64, closed: bool) -> Result<Option<Bytes>, AnswerError> {
    if buf.is_empty() {
        return match closed {
            true => Err(AnswerError::ClosedEarly),
            false => Ok(None),
        };
    }
    let take = usize::try_from(limit).map_or(buf.len(), |limit| limit.min(buf.len()));
    Ok(Some(buf.split_to(take).freeze()))
}

/// A line ended by CRLF, taken from `buf` without its end; `None` until
/// it is all there. A line longer than `limit`, or holding a bare CR or
/// LF, is a broken chunk.
fn take_line(
    buf: &mut BytesMut,
    limit: usize,
    closed: bool,
) -> Result<Option<BytesMut>, AnswerError> {
    let window = &buf[..buf.len().min(limit + 2)];
    match window.iter().position(|&b| b == b'\n') {
        Some(end) if end > 0 && window[end - 1] == b'\r' => {
            let mut line = buf.split_to(end + 1);
            line.truncate(end - 1);
            if line.contains(&b'\r') {
                return Err(AnswerError::BadChunk);
            }
            Ok(Some(line))
        }
        Some(_) => Err(AnswerError::BadChunk),
        None if window.len() > limit + 1 => Err(AnswerError::BadChunk),
        None if closed => Err(AnswerError::ClosedEarly),
        None => Ok(None),
    }
}

/// A chunk's size: hex digits (at most 15, so it fits), then nothing or
/// extensions after `;` (optionally after spaces), read and dropped.
fn chunk_size(line: &[u8]) -> Result<u64, AnswerError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(AnswerError::BadChunk);
    }
    let rest = &line[digits..];
    let rest = &rest[rest
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count()..];
    if !(rest.is_empty() || rest[0] == b';') || rest.iter().any(|&b| is_control(b)) {
        return Err(AnswerError::BadChunk);
    }
    let digits = std::str::from_utf8(&line[..digits]).map_err(|_| AnswerError::BadChunk)?;
    u64::from_str_radix(digits, 16).map_err(|_| AnswerError::BadChunk)
}

/// `name: value`, the name a token right before the colon (RFC 9110
/// §5.1, §5.6.2), the value without control characters but tabs.
fn is_field_line(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return false;
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    let token = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    !name.is_empty() && name.iter().all(token) && !value.iter().any(|&b| is_control(b))
}

/// A control character other than a tab (RFC 9110 §5.5).
fn is_control(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

#[cfg(test)]
mod tests;
