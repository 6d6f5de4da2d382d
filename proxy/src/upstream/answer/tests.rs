use proptest::prelude::*;

use super::*;

/// Everything the reader makes of `input`, fed in pieces ending at
/// `splits`, then told the upstream closed: the head, the body and
/// whether the connection may be reused, or the first refusal.
fn read(input: &[u8], splits: &[usize]) -> Result<(Head, Vec<u8>, bool), AnswerError> {
    let mut reader = AnswerReader::new();
    let mut buf = BytesMut::new();
    let (mut head, mut body) = (None, Vec::new());
    let mut ends: Vec<usize> = splits.iter().map(|&s| s.min(input.len())).collect();
    ends.sort_unstable();
    ends.push(input.len());
    let mut fed = 0;
    for (i, &end) in ends.iter().enumerate() {
        buf.extend_from_slice(&input[fed..end.max(fed)]);
        fed = end.max(fed);
        let closed = i == ends.len() - 1;
        while let Some(event) = reader.next(&mut buf, closed)? {
            match event {
                Event::Head(h) => head = Some(h),
                Event::Data(data) => body.extend_from_slice(&data),
                Event::End { reusable } => {
                    // Whatever was left unread stays in `buf`; a reusable
                    // answer leaves nothing.
                    let head = head.expect("the head comes before the end");
                    return Ok((head, body, reusable && fed == input.len()));
                }
            }
        }
    }
    panic!("told the upstream closed, the reader neither ended nor refused")
}

fn whole(input: &[u8]) -> Result<(Head, Vec<u8>, bool), AnswerError> {
    read(input, &[])
}

/// The reader refuses `input`, read whole, with `refusal`.
fn assert_refused(input: &[u8], refusal: AnswerError) {
    assert_eq!(
        whole(input).map(|_| ()),
        Err(refusal),
        "{}",
        String::from_utf8_lossy(input)
    );
}

fn body_and_reuse(input: &[u8]) -> (StatusCode, String, bool) {
    let (head, body, reusable) = whole(input).unwrap();
    (head.status, String::from_utf8(body).unwrap(), reusable)
}

const CHUNKED: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
    5;name=value\r\nhello\r\n6 \r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";

#[test]
fn answers_framed_by_length_or_chunks_are_read_whole_and_reusable() {
    let ok = |body: &str| (StatusCode::OK, body.to_owned(), true);
    assert_eq!(
        body_and_reuse(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"),
        ok("hello")
    );
    assert_eq!(
        body_and_reuse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\nContent-Length: 5\r\n\r\nhello"
        ),
        ok("hello")
    );
    assert_eq!(body_and_reuse(CHUNKED), ok("hello world"));
    // Tabs are blanks, not control characters.
    assert_eq!(
        body_and_reuse(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
            5\t;e=\tv\r\nhello\r\n0\r\nx-t:\ta\tb\r\n\r\n"
        ),
        ok("hello")
    );
    assert_eq!(
        body_and_reuse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"),
        ok("{}")
    );
    for empty in [
        &b"HTTP/1.1 204 No Content\r\n\r\n"[..],
        b"HTTP/1.1 304 Not Modified\r\ncontent-length: 100\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    ] {
        let (_, body, reusable) = whole(empty).unwrap();
        assert_eq!((body.len(), reusable), (0, true), "{empty:?}");
    }
    let (head, _, _) = whole(CHUNKED).unwrap();
    assert_eq!(head.headers["content-type"], "application/json");
    let (head, _, _) =
        whole(b"HTTP/1.1 200 OK\r\nx-empty:\r\nx-b:  b \r\ncontent-length: 0\r\n\r\n").unwrap();
    assert_eq!(head.headers["x-empty"], "");
    assert_eq!(head.headers["x-b"], "b");
    assert_eq!(head.version, Version::HTTP_11);
}

#[test]
fn a_connection_is_reused_only_when_the_answer_allows_it_and_ends_the_bytes() {
    let reused = |input: &[u8]| whole(input).unwrap().2;
    assert!(!reused(
        b"HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n"
    ));
    assert!(!reused(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"));
    assert!(reused(
        b"HTTP/1.0 200 OK\r\nconnection: Keep-Alive\r\ncontent-length: 0\r\n\r\n"
    ));
    // Framed by the close: read to the end, never reused.
    assert_eq!(
        body_and_reuse(b"HTTP/1.1 200 OK\r\n\r\nuntil the end"),
        (StatusCode::OK, "until the end".into(), false)
    );
    // Bytes after the answer: the next answer would start with them.
    let mut reader = AnswerReader::new();
    let mut buf = BytesMut::from(&b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200"[..]);
    assert!(matches!(
        reader.next(&mut buf, false),
        Ok(Some(Event::Head(_)))
    ));
    assert_eq!(
        reader.next(&mut buf, false),
        Ok(Some(Event::End { reusable: false }))
    );
}

#[test]
fn what_is_not_fully_understood_is_refused() {
    use AnswerError::*;
    let cases: [(&[u8], AnswerError); 33] = [
        // No body, but framing that reads two ways (hyper hands the head
        // on without the Content-Length), or none a 204 may have.
        (
            b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\ntransfer-encoding: chunked\r\n\r\n",
            UnsupportedFraming,
        ),
        (
            b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\ncontent-length: 7\r\n\r\n",
            UnsupportedFraming,
        ),
        (
            b"HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n",
            UnsupportedFraming,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            BadContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5,\r\n\r\nhello",
            BadContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked,\r\n\r\n0\r\n\r\n",
            UnsupportedFraming,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx-t\xff: 1\r\n\r\n",
            BadChunk,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx-t : 1\r\n\r\n",
            BadChunk,
        ),
        (
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            UnsupportedFraming,
        ),
        (b"", ClosedBeforeAnswer),
        (b"HTTP/1.1 200 OK\r\ncontent-len", ClosedEarly),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel",
            ClosedEarly,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
            ClosedEarly,
        ),
        (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", MalformedHead),
        (b"HTTP/2 200 OK\r\n\r\n", MalformedHead),
        (
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            UnexpectedStatus,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            UnsupportedFraming,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            UnsupportedFraming,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            UnsupportedFraming,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\nhello",
            BadContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello",
            BadContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            BadContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nx\r\n",
            BadChunk,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1000000000000000\r\n",
            BadChunk,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
            BadChunk,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
            BadChunk,
        ),
        // A bare LF ends no line: not after an extension, not in a
        // trailer, not as the whole line.
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;e=v\nhello\r\n0\r\n\r\n",
            BadChunk,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx-t: 1\n\r\n",
            BadChunk,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\n5\r\nhello\r\n0\r\n\r\n",
            BadChunk,
        ),
        // After a chunk's size: blanks, then nothing or `;` only.
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5x\r\nhello\r\n0\r\n\r\n",
            BadChunk,
        ),
        // Control characters: in an extension, in a trailer's value.
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;e=\x01\r\nhello\r\n0\r\n\r\n",
            BadChunk,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx-t: a\x7fb\r\n\r\n",
            BadChunk,
        ),
        // A trailer without a name.
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n: 1\r\n\r\n",
            BadChunk,
        ),
    ];
    for (input, refusal) in cases {
        assert_refused(input, refusal);
    }
    let informational = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INFORMATIONAL + 1);
    assert_refused(&informational, UnexpectedStatus);
    let long = format!(
        "HTTP/1.1 200 OK\r\nx: {}\r\n\r\n",
        "a".repeat(MAX_HEAD_BYTES)
    );
    assert_refused(long.as_bytes(), HeadTooLarge);
}

/// Each limit lets through what reaches it and refuses one byte, field or
/// digit more: a head of 64 KiB, a chunk's size line of 4 KiB, a chunk
/// size of 15 hex digits, a length of 18 digits, trailers of 8 KiB or 50
/// fields (numbers, not the constants, so that the limits themselves are
/// pinned).
#[test]
fn every_limit_is_reached_and_not_passed() {
    /// A head of exactly `size` bytes, its blank line included.
    fn head_of(size: usize) -> Vec<u8> {
        let start = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx: ";
        let mut head = start.to_vec();
        head.resize(size - 4, b'a');
        head.extend_from_slice(b"\r\n\r\n");
        head
    }
    assert!(whole(&head_of(64 * 1024)).is_ok());
    assert_refused(&head_of(64 * 1024 + 1), AnswerError::HeadTooLarge);
    // 64 KiB of a head not yet ended: refused without waiting for more.
    let mut unended = BytesMut::from(&head_of(64 * 1024 + 1)[..64 * 1024]);
    assert_eq!(
        AnswerReader::new().next(&mut unended, false),
        Err(AnswerError::HeadTooLarge)
    );

    /// A chunked answer of one chunk (`A`) whose size line is `size_line`
    /// bytes (extensions fill it), then `trailers`.
    fn chunked(size_line: usize, trailers: &[u8]) -> Vec<u8> {
        let mut answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;e=".to_vec();
        answer.resize(answer.len() + size_line - 4, b'x');
        answer.extend_from_slice(b"\r\nA\r\n0\r\n");
        answer.extend_from_slice(trailers);
        answer.extend_from_slice(b"\r\n");
        answer
    }
    let longest = chunked(4 * 1024, b"");
    assert_eq!(whole(&longest).unwrap().1, b"A");
    // Arriving without its line end, or with only its CR, the longest
    // line is waited for, not refused.
    let cr = longest.windows(5).position(|w| w == b"\r\nA\r\n").unwrap();
    assert_eq!(read(&longest, &[cr, cr + 1]).unwrap().1, b"A");
    assert_refused(&chunked(4 * 1024 + 1, b""), AnswerError::BadChunk);

    // Numbers: a chunk size of 15 hex digits and a length of 18 decimal
    // ones are read (then the body is missing); one digit more is refused.
    for (answer, refusal) in [
        (
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffff\r\n"[..],
            AnswerError::ClosedEarly,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0fffffffffffffff\r\n",
            AnswerError::BadChunk,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 999999999999999999\r\n\r\n",
            AnswerError::ClosedEarly,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 0999999999999999999\r\n\r\n",
            AnswerError::BadContentLength,
        ),
    ] {
        assert_refused(answer, refusal);
    }

    /// `fields` trailer fields of `bytes` bytes in all, line ends included.
    fn trailers(fields: usize, bytes: usize) -> Vec<u8> {
        let mut lines = Vec::new();
        for i in 0..fields {
            let line = format!("t{i}: ");
            let value = bytes / fields - line.len() - 2 + usize::from(i == 0) * (bytes % fields);
            lines.extend_from_slice(line.as_bytes());
            lines.resize(lines.len() + value, b'v');
            lines.extend_from_slice(b"\r\n");
        }
        assert_eq!(lines.len(), bytes);
        lines
    }
    for (fields, bytes, read) in [
        (2, 8 * 1024, true),
        (2, 8 * 1024 + 1, false),
        (50, 50 * 8, true),
        (51, 51 * 8, false),
    ] {
        let answer = whole(&chunked(4, &trailers(fields, bytes)));
        match read {
            true => assert_eq!(answer.unwrap().1, b"A", "{fields} fields, {bytes} bytes"),
            false => assert_eq!(
                answer.map(|_| ()),
                Err(AnswerError::BadChunk),
                "{fields} fields, {bytes} bytes"
            ),
        }
    }
}

proptest! {
    /// However the bytes arrive, the reading is the same.
    #[test]
    fn any_split_reads_the_same(
        input in prop::sample::select(vec![
            CHUNKED,
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"[..],
            b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloXX",
        ]),
        splits in prop::collection::vec(0usize..200, 0..12),
    ) {
        prop_assert_eq!(read(input, &splits), whole(input));
    }
}
