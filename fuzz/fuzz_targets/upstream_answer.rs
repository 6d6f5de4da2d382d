//! The proxy's reader of an upstream's answer against hyper's client, on
//! the same bytes. Invariant: whatever the reader accepts, hyper reads the
//! same way (status, headers, body); and when the reader says the
//! connection may carry another request, hyper finds the answer's end at
//! the same byte without the upstream closing. Splitting the bytes
//! anywhere changes nothing. The reader may refuse what hyper accepts.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tenant_proxy::upstream::answer::{AnswerError, AnswerReader, Event, Head};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Reading = (http::StatusCode, http::HeaderMap, Vec<u8>);

fuzz_target!(|data: &[u8]| {
    let Some((&split, answer)) = data.split_first() else {
        return;
    };
    let whole = ours(answer, answer.len());
    let split = usize::from(split).min(answer.len());
    // Split, the answer may end before bytes after it have come: then it
    // looks reusable where the whole input shows stray bytes (those are
    // caught when the connection is taken again). Nothing else may differ.
    match (ours(answer, split), &whole) {
        (Ok((reading, reusable)), Ok((whole_reading, whole_reusable))) => {
            assert_eq!(&reading, whole_reading, "a split changed the reading");
            assert!(
                reusable || !whole_reusable,
                "a split made an answer unreusable"
            );
        }
        (split, whole) => assert_eq!(split.map(|_| ()), whole.clone().map(|_| ())),
    }
    let Ok(((status, headers, body), reusable)) = whole else {
        return;
    };
    let theirs = hyper_reads(answer, !reusable)
        .unwrap_or_else(|why| panic!("the reader accepted what hyper did not read: {why}"));
    assert_eq!(theirs.0, status);
    assert_eq!(theirs.1, headers);
    assert_eq!(theirs.2, body);
});

/// The reader's result, fed `answer[..split]` and then the rest, then
/// told the upstream closed (unless it ended before).
fn ours(answer: &[u8], split: usize) -> Result<(Reading, bool), AnswerError> {
    let mut reader = AnswerReader::new();
    let mut buf = BytesMut::new();
    let mut head: Option<Head> = None;
    let mut body = Vec::new();
    for (piece, closed) in [
        (&answer[..split], false),
        (&answer[split..], false),
        (&[][..], true),
    ] {
        buf.extend_from_slice(piece);
        while let Some(event) = reader.next(&mut buf, closed)? {
            match event {
                Event::Head(h) => head = Some(h),
                Event::Data(data) => body.extend_from_slice(&data),
                Event::End { reusable } => {
                    let head = head.expect("the head comes first");
                    // Reusable means: nothing was left over.
                    assert!(!reusable || (buf.is_empty() && !closed));
                    return Ok(((head.status, head.headers, body), reusable));
                }
            }
        }
    }
    panic!("told the upstream closed, the reader neither ended nor refused");
}

/// hyper's client reading `answer` to a GET. With `close`, the upstream
/// closes after sending it; without, it stays open, so hyper must find
/// the end from the framing alone (bounded by a timeout).
fn hyper_reads(answer: &[u8], close: bool) -> Result<Reading, String> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    });
    let answer = answer.to_vec();
    runtime.block_on(async move {
        let (client, mut upstream) = tokio::io::duplex(1 << 20);
        let upstream = tokio::spawn(async move {
            let mut request = Vec::new();
            while !request.ends_with(b"\r\n\r\n") {
                let mut byte = [0];
                if upstream.read(&mut byte).await.ok()? == 0 {
                    return None;
                }
                request.push(byte[0]);
            }
            upstream.write_all(&answer).await.ok()?;
            if close {
                drop(upstream);
                return None;
            }
            Some(upstream) // kept open until the exchange is over
        });
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .map_err(|e| e.to_string())?;
        let connection = tokio::spawn(connection);
        let request = http::Request::get("/")
            .header("host", "upstream")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let exchange = async {
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| format!("{e:?}"))?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(|e| format!("body: {e:?}"))?;
            Ok((parts.status, parts.headers, body.to_bytes().to_vec()))
        };
        let read = tokio::time::timeout(Duration::from_secs(2), exchange)
            .await
            .unwrap_or_else(|_| Err("no end of the answer within 2 s".into()));
        // Both tasks ended before the runtime is left: one still pending
        // in the kept runtime would hold its stream past the last input,
        // which LeakSanitizer reports as a leak when the run ends.
        drop(sender);
        for task in [connection.abort_handle(), upstream.abort_handle()] {
            task.abort();
        }
        let _ = connection.await;
        let _ = upstream.await;
        read
    })
}
