use super::*;
use crate::prompb::{self, v2, Label, Sample, TimeSeries, WriteRequest};
use http::HeaderValue;
use proptest::prelude::*;
use prost::Message;

const OWNED: &[&str] = &["team-a", "team-a-2"];

fn owned() -> Vec<String> {
    OWNED.iter().map(|s| s.to_string()).collect()
}

fn tenant(owned: &[String], policy: ForeignLabelPolicy) -> TenantLabel<'_> {
    TenantLabel {
        name: "namespace",
        owned,
        owned_by: "team-a",
        policy,
    }
}

fn series(labels: &[(&str, &str)]) -> TimeSeries {
    TimeSeries {
        labels: labels
            .iter()
            .map(|(n, v)| Label {
                name: n.to_string(),
                value: v.to_string(),
            })
            .collect(),
        samples: vec![Sample {
            value: 1.5,
            timestamp: 1_700_000_000_000,
        }],
        exemplars: vec![vec![0x0a, 0x02, 0x08, 0x01]],
        histograms: vec![vec![0x08, 0x05, 0x10, 0x07]],
    }
}

fn v1(series: Vec<TimeSeries>) -> Vec<u8> {
    WriteRequest {
        timeseries: series,
        metadata: vec![vec![0x08, 0x01, 0x12, 0x03, b'f', b'o', b'o']],
    }
    .encode_to_vec()
}

fn rewrite_v1_ok(body: &[u8], policy: ForeignLabelPolicy) -> (WriteRequest, Stats) {
    let owned = owned();
    let (out, stats) = rewrite(Version::V1, body, &tenant(&owned, policy)).unwrap();
    (WriteRequest::decode(out.as_slice()).unwrap(), stats)
}

fn pairs(ts: &TimeSeries) -> Vec<(String, String)> {
    ts.labels
        .iter()
        .map(|l| (l.name.clone(), l.value.clone()))
        .collect()
}

fn p(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn v1_adds_keeps_and_overwrites_the_tenant_label() {
    let body = v1(vec![
        series(&[("__name__", "up"), ("job", "a")]),
        series(&[("__name__", "up"), ("namespace", "team-a-2")]),
        series(&[("__name__", "up"), ("namespace", "team-b"), ("zone", "x")]),
        series(&[
            ("__name__", "up"),
            ("namespace", "team-a"),
            ("namespace", "team-a"),
        ]),
        series(&[
            ("__name__", "up"),
            ("namespace", "team-a"),
            ("namespace", "team-b"),
        ]),
    ]);
    let (out, stats) = rewrite_v1_ok(&body, ForeignLabelPolicy::Overwrite);
    let got: Vec<_> = out.timeseries.iter().map(pairs).collect();
    assert_eq!(
        got[0],
        p(&[("__name__", "up"), ("job", "a"), ("namespace", "team-a")])
    );
    assert_eq!(got[1], p(&[("__name__", "up"), ("namespace", "team-a-2")]));
    assert_eq!(
        got[2],
        p(&[("__name__", "up"), ("namespace", "team-a"), ("zone", "x")])
    );
    assert_eq!(
        got[3],
        p(&[("__name__", "up"), ("namespace", "team-a")]),
        "duplicates collapse"
    );
    assert_eq!(
        got[4],
        p(&[("__name__", "up"), ("namespace", "team-a")]),
        "mixed copies overwrite"
    );
    assert_eq!(
        stats,
        Stats {
            series: 5,
            samples: 5,
            added: 1,
            overwritten: 2
        }
    );
}

#[test]
fn v1_keeps_samples_exemplars_histograms_and_metadata_byte_for_byte() {
    let input = series(&[("__name__", "up")]);
    let body = v1(vec![input.clone()]);
    let (out, _) = rewrite_v1_ok(&body, ForeignLabelPolicy::Overwrite);
    let ts = &out.timeseries[0];
    assert_eq!(ts.samples, input.samples);
    assert_eq!(ts.exemplars, input.exemplars);
    assert_eq!(ts.histograms, input.histograms);
    assert_eq!(
        out.metadata,
        vec![vec![0x08, 0x01, 0x12, 0x03, b'f', b'o', b'o']]
    );
}

#[test]
fn v1_keeps_fields_no_schema_here_knows() {
    let mut body = v1(vec![series(&[("__name__", "up")])]);
    // An unknown top-level field 15 (varint 42).
    body.extend_from_slice(&[0x78, 42]);
    let owned = owned();
    let (out, _) = rewrite(
        Version::V1,
        &body,
        &tenant(&owned, ForeignLabelPolicy::Overwrite),
    )
    .unwrap();
    assert!(out.ends_with(&[0x78, 42]));
}

#[test]
fn v1_sorts_unsorted_labels() {
    let body = v1(vec![series(&[
        ("zone", "x"),
        ("__name__", "up"),
        ("app", "y"),
    ])]);
    let (out, _) = rewrite_v1_ok(&body, ForeignLabelPolicy::Overwrite);
    let names: Vec<_> = out.timeseries[0]
        .labels
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(names, ["__name__", "app", "namespace", "zone"]);
}

/// A `Label` whose name field appears twice: protobuf decoders keep the
/// last one, so to the receiver this is `namespace="victim"`.
#[test]
fn v1_sees_a_label_name_smuggled_in_a_repeated_field() {
    let mut smuggled = Vec::new();
    protowire::write_len_field(&mut smuggled, 1, b"app");
    protowire::write_len_field(&mut smuggled, 1, b"namespace");
    protowire::write_len_field(&mut smuggled, 2, b"victim");
    let mut series_bytes = Vec::new();
    protowire::write_len_field(&mut series_bytes, 1, &smuggled);
    series_bytes.extend(series(&[("__name__", "up")]).encode_to_vec());
    let mut body = Vec::new();
    protowire::write_len_field(&mut body, 1, &series_bytes);

    let (out, stats) = rewrite_v1_ok(&body, ForeignLabelPolicy::Overwrite);
    assert_eq!(stats.overwritten, 1);
    assert_eq!(
        pairs(&out.timeseries[0]),
        p(&[("__name__", "up"), ("namespace", "team-a")])
    );
    let owned = owned();
    let refused = rewrite(
        Version::V1,
        &body,
        &tenant(&owned, ForeignLabelPolicy::Reject),
    );
    assert!(matches!(refused, Err(RemoteWriteError::ForeignLabel(_))));
}

#[test]
fn reject_policy_names_the_offending_series() {
    let body = v1(vec![
        series(&[("__name__", "ok"), ("namespace", "team-a")]),
        series(&[("__name__", "stolen"), ("namespace", "team-b")]),
    ]);
    let owned = owned();
    let err = rewrite(
        Version::V1,
        &body,
        &tenant(&owned, ForeignLabelPolicy::Reject),
    )
    .unwrap_err();
    let RemoteWriteError::ForeignLabel(series) = err else {
        panic!("{err:?}")
    };
    assert!(
        series.contains("stolen") && series.contains("team-b"),
        "{series}"
    );
}

#[test]
fn empty_requests_stay_empty() {
    let owned = owned();
    let (out, stats) = rewrite(
        Version::V1,
        &[],
        &tenant(&owned, ForeignLabelPolicy::Overwrite),
    )
    .unwrap();
    assert!(out.is_empty());
    assert_eq!(stats, Stats::default());
    let (out, _) = rewrite(
        Version::V2,
        &[],
        &tenant(&owned, ForeignLabelPolicy::Overwrite),
    )
    .unwrap();
    assert_eq!(
        v2::Request::decode(out.as_slice()).unwrap().symbols,
        ["namespace"]
    );
}

#[test]
fn garbage_is_malformed_not_a_panic() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    for garbage in [&b"\xff\xff\xff"[..], b"\x0a\x05abc", b"\x0b"] {
        for version in [Version::V1, Version::V2] {
            assert!(matches!(
                rewrite(version, garbage, &t),
                Err(RemoteWriteError::Malformed(_))
            ));
        }
    }
    // A series whose label field is cut short, in each version's series field.
    assert!(matches!(
        rewrite(Version::V1, b"\x0a\x02\x0a\x10", &t),
        Err(RemoteWriteError::Malformed(_))
    ));
    assert!(matches!(
        rewrite(Version::V2, b"\x2a\x02\x0a\x10", &t),
        Err(RemoteWriteError::Malformed(_))
    ));
}

// === 2.0 ===

fn v2_request(series: &[&[(&str, &str)]]) -> v2::Request {
    let mut symbols = vec![String::new()];
    let mut intern = |s: &str| match symbols.iter().position(|x| x == s) {
        Some(i) => i as u32,
        None => {
            symbols.push(s.to_string());
            (symbols.len() - 1) as u32
        }
    };
    let timeseries = series
        .iter()
        .map(|labels| v2::TimeSeries {
            labels_refs: labels
                .iter()
                .flat_map(|(n, v)| [intern(n), intern(v)])
                .collect(),
            samples: vec![v2::Sample {
                value: 2.0,
                timestamp: 1_700_000_000_000,
            }],
            histograms: vec![],
            exemplars: vec![vec![0x0a, 0x02, 0x01, 0x02]],
            metadata: Some(vec![0x08, 0x02]),
        })
        .collect();
    v2::Request {
        symbols,
        timeseries,
    }
}

fn v2_labels(request: &v2::Request, i: usize) -> Vec<(String, String)> {
    request.timeseries[i]
        .labels_refs
        .chunks(2)
        .map(|c| {
            (
                request.symbols[c[0] as usize].clone(),
                request.symbols[c[1] as usize].clone(),
            )
        })
        .collect()
}

#[test]
fn v2_rewrites_through_the_symbols_table() {
    let input = v2_request(&[
        &[("__name__", "up"), ("job", "a")],
        &[("__name__", "up"), ("namespace", "team-b")],
        &[("__name__", "up"), ("namespace", "team-a-2")],
    ]);
    let owned = owned();
    let (out, stats) = rewrite(
        Version::V2,
        &input.encode_to_vec(),
        &tenant(&owned, ForeignLabelPolicy::Overwrite),
    )
    .unwrap();
    let out = v2::Request::decode(out.as_slice()).unwrap();
    assert_eq!(
        &out.symbols[..input.symbols.len()],
        &input.symbols[..],
        "existing refs keep their meaning"
    );
    assert_eq!(
        v2_labels(&out, 0),
        p(&[("__name__", "up"), ("job", "a"), ("namespace", "team-a")])
    );
    assert_eq!(
        v2_labels(&out, 1),
        p(&[("__name__", "up"), ("namespace", "team-a")])
    );
    assert_eq!(
        v2_labels(&out, 2),
        p(&[("__name__", "up"), ("namespace", "team-a-2")])
    );
    assert_eq!(out.timeseries[0].exemplars, input.timeseries[0].exemplars);
    assert_eq!(out.timeseries[0].metadata, input.timeseries[0].metadata);
    assert_eq!(out.timeseries[0].samples, input.timeseries[0].samples);
    assert_eq!((stats.series, stats.added, stats.overwritten), (3, 1, 1));
}

#[test]
fn v2_refuses_bad_references() {
    let mut input = v2_request(&[&[("__name__", "up")]]);
    input.timeseries[0].labels_refs.push(99);
    input.timeseries[0].labels_refs.push(1);
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    assert!(matches!(
        rewrite(Version::V2, &input.encode_to_vec(), &t),
        Err(RemoteWriteError::Malformed(_))
    ));
    input.timeseries[0].labels_refs.pop();
    assert!(matches!(
        rewrite(Version::V2, &input.encode_to_vec(), &t),
        Err(RemoteWriteError::Malformed(_))
    ));
}

// === HTTP surface ===

fn headers(content_type: Option<&str>, encoding: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(ct) = content_type {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
    }
    if let Some(e) = encoding {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_str(e).unwrap());
    }
    h
}

#[test]
fn content_type_is_read_strictly() {
    let v = |ct| version_of(&headers(ct, None));
    assert_eq!(v(None), Ok(Version::V1));
    assert_eq!(v(Some("application/x-protobuf")), Ok(Version::V1));
    assert_eq!(
        v(Some("application/x-protobuf;proto=prometheus.WriteRequest")),
        Ok(Version::V1)
    );
    assert_eq!(
        v(Some(
            "application/x-protobuf;proto=io.prometheus.write.v2.Request"
        )),
        Ok(Version::V2)
    );
    for bad in [
        "application/x-protobuf; proto=io.prometheus.write.v2.Request",
        "application/x-protobuf;proto=io.prometheus.write.v3.Request",
        "application/x-protobuf;charset=utf-8",
        "application/json",
        "multipart/form-data",
    ] {
        assert!(
            matches!(v(Some(bad)), Err(RemoteWriteError::Unsupported(_))),
            "{bad}"
        );
    }
}

#[test]
fn body_is_size_checked_before_decompressing() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let raw = v1(vec![series(&[
        ("__name__", "up"),
        ("big", &"x".repeat(10_000)),
    ])]);
    let compressed = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
    let h = headers(Some("application/x-protobuf"), Some("snappy"));
    assert!(rewrite_body(&h, &compressed, &t, 100_000).is_ok());
    assert_eq!(
        rewrite_body(&h, &compressed, &t, 1_000),
        Err(RemoteWriteError::TooLarge {
            size: raw.len() as u64,
            limit: 1_000
        })
    );
    // A snappy header claiming 4 GiB is refused without allocating it.
    let bomb = [0xff, 0xff, 0xff, 0xff, 0x0f, 0x00];
    assert!(matches!(
        rewrite_body(&h, &bomb, &t, 1 << 26),
        Err(RemoteWriteError::TooLarge { .. })
    ));
    assert!(matches!(
        rewrite_body(&h, &compressed[..compressed.len() / 2], &t, 100_000),
        Err(RemoteWriteError::Malformed(_))
    ));
    assert!(matches!(
        rewrite_body(&headers(None, Some("gzip")), &compressed, &t, 100_000),
        Err(RemoteWriteError::Unsupported(_))
    ));
}

#[test]
fn a_body_that_needs_no_change_is_forwarded_as_it_came() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let h = headers(Some("application/x-protobuf"), Some("snappy"));
    let compress = |raw: &[u8]| snap::raw::Encoder::new().compress_vec(raw).unwrap();
    let ready = compress(&v1(vec![
        series(&[("__name__", "up"), ("namespace", "team-a")]),
        series(&[("__name__", "up"), ("namespace", "team-a-2"), ("pod", "p")]),
    ]));
    let (out, stats) = rewrite_body(&h, &ready, &t, 1 << 20).unwrap();
    assert_eq!(out, Rewritten::Unchanged);
    assert_eq!((stats.series, stats.added, stats.overwritten), (2, 0, 0));

    // One series that needs the label is enough to rewrite the whole body.
    for needs_work in [
        vec![("__name__", "up")],
        vec![("__name__", "up"), ("namespace", "team-b")],
        vec![("namespace", "team-a"), ("__name__", "up")], // unsorted
        vec![
            ("__name__", "up"),
            ("namespace", "team-a"),
            ("namespace", "team-a"),
        ],
    ] {
        let raw = v1(vec![
            series(&[("__name__", "up"), ("namespace", "team-a")]),
            series(&needs_work),
        ]);
        let (out, _) = rewrite_body(&h, &compress(&raw), &t, 1 << 20).unwrap();
        let Rewritten::Body(body) = out else {
            panic!("{needs_work:?} must be rewritten");
        };
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        let sent = WriteRequest::decode(raw.as_slice()).unwrap();
        let namespaces: Vec<_> = sent.timeseries[1]
            .labels
            .iter()
            .filter(|l| l.name == "namespace")
            .map(|l| l.value.as_str())
            .collect();
        assert!(matches!(namespaces[..], ["team-a"]), "{needs_work:?}");
    }
}

// === properties ===

proptest! {
    /// Any bytes: an error or a body whose every series carries exactly one
    /// owned tenant label, with labels sorted. Never a panic.
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let owned = owned();
        let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
        let _ = rewrite(Version::V1, &bytes, &t);
        let _ = rewrite(Version::V2, &bytes, &t);
    }

    #[test]
    fn every_rewritten_series_carries_one_owned_tenant_label(
        raw_series in prop::collection::vec(
            prop::collection::vec(
                (prop::sample::select(vec!["__name__", "job", "namespace", "zone", "a"]),
                 prop::sample::select(vec!["up", "team-a", "team-a-2", "team-b", ""])),
                0..6),
            0..8),
    ) {
        let body = v1(raw_series.iter().map(|labels| series(labels)).collect());
        let (out, stats) = rewrite_v1_ok(&body, ForeignLabelPolicy::Overwrite);
        prop_assert_eq!(out.timeseries.len(), raw_series.len());
        prop_assert_eq!(stats.series as usize, raw_series.len());
        for ts in &out.timeseries {
            let ours: Vec<_> = ts.labels.iter().filter(|l| l.name == "namespace").collect();
            prop_assert_eq!(ours.len(), 1);
            prop_assert!(OWNED.contains(&ours[0].value.as_str()));
            prop_assert!(ts.labels.windows(2).all(|w| w[0].name <= w[1].name));
        }
        let v2_in = v2_request(&raw_series.iter().map(|s| s.as_slice()).collect::<Vec<_>>());
        let owned = owned();
        let (out, _) = rewrite(Version::V2, &v2_in.encode_to_vec(), &tenant(&owned, ForeignLabelPolicy::Overwrite)).unwrap();
        let out = v2::Request::decode(out.as_slice()).unwrap();
        for i in 0..out.timeseries.len() {
            let labels = v2_labels(&out, i);
            let ours: Vec<_> = labels.iter().filter(|(n, _)| n == "namespace").collect();
            prop_assert_eq!(ours.len(), 1);
            prop_assert!(OWNED.contains(&ours[0].1.as_str()));
        }
    }
}

#[test]
fn prompb_v1_types_round_trip() {
    let request = WriteRequest {
        timeseries: vec![series(&[("__name__", "up")])],
        metadata: vec![],
    };
    assert_eq!(
        prompb::WriteRequest::decode(request.encode_to_vec().as_slice()).unwrap(),
        request
    );
}
