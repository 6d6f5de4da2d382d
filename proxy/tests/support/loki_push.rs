//! Loki 3.x's push body, as its distributor reads it
//! (`pkg/loghttp/push/push.go`, `ParseLokiRequest`, read at v3.x), for the
//! Loki stand-in: a body real Loki would refuse is refused here too, so a
//! test cannot pass on a push that only a lenient stand-in takes.
//!
//! - `Content-Encoding`: none or `snappy` (the body as it is), `gzip`,
//!   `deflate` (raw DEFLATE, Go's `compress/flate`); compared exactly, any
//!   other 400;
//! - `Content-Type` by Go's `mime.ParseMediaType`: none is 400 ("mime: no
//!   media type"); `application/json` is JSON (the v1 shape under
//!   `/loki/api/v1/`, the legacy shape elsewhere); anything else is
//!   snappy-compressed protobuf (`logproto.PushRequest`);
//! - each stream must name at least one label (the distributor's check).
//!
//! Skipped: label syntax beyond the braces, timestamps' range and order,
//! structured metadata, per-tenant limits.

use std::io::Read;

use http::{HeaderMap, StatusCode};
use prost::Message;

use super::loki::Refusal;

/// `logproto.PushRequest`: field numbers of `pkg/push/push.proto`.
#[derive(Clone, PartialEq, Message)]
pub struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    pub streams: Vec<StreamAdapter>,
}

#[derive(Clone, PartialEq, Message)]
pub struct StreamAdapter {
    #[prost(string, tag = "1")]
    pub labels: String,
    #[prost(message, repeated, tag = "2")]
    pub entries: Vec<EntryAdapter>,
}

#[derive(Clone, PartialEq, Message)]
pub struct EntryAdapter {
    #[prost(message, optional, tag = "1")]
    pub timestamp: Option<Timestamp>,
    /// Bytes: gogo's decoder does not check UTF-8.
    #[prost(bytes = "vec", tag = "2")]
    pub line: Vec<u8>,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// A v1 JSON push of one stream `{app="test"}` holding `line`.
pub fn json(line: &str) -> String {
    serde_json::json!({
        "streams": [{"stream": {"app": "test"}, "values": [["1700000000000000000", line]]}]
    })
    .to_string()
}

/// A snappy-compressed protobuf push of one stream holding `lines`.
pub fn protobuf(lines: &[&str]) -> Vec<u8> {
    let request = PushRequest {
        streams: vec![StreamAdapter {
            labels: r#"{app="test"}"#.into(),
            entries: lines
                .iter()
                .map(|line| EntryAdapter {
                    timestamp: Some(Timestamp {
                        seconds: 1_700_000_000,
                        nanos: 0,
                    }),
                    line: line.as_bytes().to_vec(),
                })
                .collect(),
        }],
    };
    snap::raw::Encoder::new()
        .compress_vec(&request.encode_to_vec())
        .unwrap()
}

/// The lines of a push to `path`, or Loki's refusal (400).
pub fn lines(path: &str, headers: &HeaderMap, body: &[u8]) -> Result<Vec<String>, Refusal> {
    read(path, headers, body).map_err(|e| (StatusCode::BAD_REQUEST, e))
}

fn read(path: &str, headers: &HeaderMap, body: &[u8]) -> Result<Vec<String>, String> {
    let single = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().map_err(|e| e.to_string()))
            .transpose()
    };
    let raw = match single("content-encoding")?.unwrap_or("") {
        "" | "snappy" => body.to_vec(),
        "gzip" => undo(flate2::read::GzDecoder::new(body))?,
        "deflate" => undo(flate2::read::DeflateDecoder::new(body))?,
        other => return Err(format!("Content-Encoding {other:?} not supported")),
    };
    let media_type = single("content-type")?
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match media_type.as_str() {
        "" => Err("mime: no media type".into()),
        "application/json" if path.contains("/loki/api/v1") => json_v1(&raw),
        "application/json" => json_legacy(&raw),
        _ => proto(&raw),
    }
}

fn undo(mut reader: impl Read) -> Result<Vec<u8>, String> {
    let mut raw = Vec::new();
    reader.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    Ok(raw)
}

fn proto(raw: &[u8]) -> Result<Vec<String>, String> {
    let decoded = snap::raw::Decoder::new()
        .decompress_vec(raw)
        .map_err(|e| e.to_string())?;
    let request = PushRequest::decode(decoded.as_slice()).map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    for stream in request.streams {
        labelled(&stream.labels)?;
        lines.extend(
            stream
                .entries
                .iter()
                .map(|e| String::from_utf8_lossy(&e.line).into_owned()),
        );
    }
    Ok(lines)
}

/// The distributor's check that a stream is labelled (`{}` is not).
fn labelled(labels: &str) -> Result<(), String> {
    let inner = labels
        .strip_prefix('{')
        .and_then(|l| l.strip_suffix('}'))
        .ok_or_else(|| format!("error parsing labels {labels:?}"))?;
    if inner.trim().is_empty() {
        return Err("error at least one label pair is required per stream".into());
    }
    Ok(())
}

/// `{"streams":[{"stream":{..},"values":[["<ns>","<line>"(,{..})?],..]}]}`.
fn json_v1(raw: &[u8]) -> Result<Vec<String>, String> {
    let document: serde_json::Value = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    for stream in streams(&document)? {
        let labels = stream["stream"]
            .as_object()
            .ok_or("stream: not an object")?;
        if labels.is_empty() {
            return Err("error at least one label pair is required per stream".into());
        }
        for value in stream["values"].as_array().ok_or("values: not an array")? {
            let entry = value.as_array().ok_or("value: not an array")?;
            let (Some(ts), Some(line), 2..=3) = (
                entry.first().and_then(|t| t.as_str()),
                entry.get(1).and_then(|l| l.as_str()),
                entry.len(),
            ) else {
                return Err(format!("value {value}: not [timestamp, line]"));
            };
            ts.parse::<i64>()
                .map_err(|e| format!("timestamp {ts:?}: {e}"))?;
            lines.push(line.to_owned());
        }
    }
    Ok(lines)
}

/// `/api/prom/push`: `{"streams":[{"labels":"{..}","entries":[{"ts":..,"line":..}]}]}`.
fn json_legacy(raw: &[u8]) -> Result<Vec<String>, String> {
    let document: serde_json::Value = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    for stream in streams(&document)? {
        labelled(stream["labels"].as_str().ok_or("labels: not a string")?)?;
        for entry in stream["entries"]
            .as_array()
            .ok_or("entries: not an array")?
        {
            entry["ts"].as_str().ok_or("ts: not a string")?;
            lines.push(
                entry["line"]
                    .as_str()
                    .ok_or("line: not a string")?
                    .to_owned(),
            );
        }
    }
    Ok(lines)
}

fn streams(document: &serde_json::Value) -> Result<&Vec<serde_json::Value>, String> {
    document["streams"]
        .as_array()
        .ok_or_else(|| "streams: not an array".into())
}
