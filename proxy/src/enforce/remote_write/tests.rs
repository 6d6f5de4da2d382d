use super::headers::V2_CONTENT_TYPE;
use super::*;
use crate::config::ForeignLabelPolicy;
use crate::enforce::prompb::{self, readings, v2, Label, Sample, TimeSeries, WriteRequest};
use crate::enforce::protowire::{fields, LEN, VARINT};
use crate::enforce::tenant_label::team_a as tenant;
use http::header::{self, HeaderMap, HeaderValue};
use proptest::prelude::*;
use prost::Message;

const OWNED: &[&str] = &["team-a", "team-a-2"];

fn owned() -> Vec<String> {
    OWNED.iter().map(|s| s.to_string()).collect()
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
            overwritten: 2,
            dropped_fields: 0,
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
fn v1_refuses_a_top_level_field_no_schema_here_knows() {
    // Copied verbatim before issue #13: no check had read it.
    let mut body = v1(vec![series(&[("__name__", "up")])]);
    // An unknown top-level field 15 (varint 42).
    body.extend_from_slice(&[0x78, 42]);
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    assert_eq!(refused_field(rewrite(Version::V1, &body, &t)), (15, ""));
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

/// What encoders send (prost here: labels first, each short, sorted; then
/// samples, exemplars, histograms): every series is spliced, the tenant
/// label added, replaced or kept where its name sorts, every other byte as
/// it came.
#[test]
fn v1_an_encoders_series_is_spliced_where_the_tenant_label_sorts() {
    type Labels<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(Labels, Labels)] = &[
        (&[], &[("namespace", "team-a")]),
        (
            &[("__name__", "up"), ("job", "x")],
            &[("__name__", "up"), ("job", "x"), ("namespace", "team-a")],
        ),
        (&[("zone", "z")], &[("namespace", "team-a"), ("zone", "z")]),
        (
            &[("__name__", "up"), ("namespace", "team-b"), ("zone", "z")],
            &[("__name__", "up"), ("namespace", "team-a"), ("zone", "z")],
        ),
        (
            &[("__name__", "up"), ("namespace", "team-a-2"), ("zone", "z")],
            &[("__name__", "up"), ("namespace", "team-a-2"), ("zone", "z")],
        ),
        (&[("namespace", "team-b")], &[("namespace", "team-a")]),
        // Names that share the tenant label's first eight bytes or more.
        (
            &[("namespac", "x"), ("namespace2", "y")],
            &[
                ("namespac", "x"),
                ("namespace", "team-a"),
                ("namespace2", "y"),
            ],
        ),
    ];
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    for (sent, expected) in cases {
        let before = spliced_so_far();
        let (out, stats) = rewrite(Version::V1, &v1(vec![series(sent)]), &t).unwrap();
        assert_eq!(spliced_so_far() - before, 1, "{sent:?} spliced");
        assert_eq!(out, v1(vec![series(expected)]), "{sent:?}");
        assert_eq!((stats.series, stats.samples), (1, 1));
    }
}

/// Any other layout takes the general rewrite, which sorts, joins and
/// refuses as before: the splice is only ever a shorter way to its bytes.
#[test]
fn v1_a_series_laid_out_otherwise_is_rewritten_in_general() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let long = "v".repeat(200);
    let expected = |labels: &[(&str, &str)]| v1(vec![series(labels)]);
    // A label moved after the series' histogram.
    let label_last = {
        let mut bytes = series(&[("zone", "z")]).encode_to_vec();
        let label = bytes.drain(..bytes[1] as usize + 2).collect::<Vec<_>>();
        bytes.extend(label);
        let mut body = top_level(1, &bytes);
        body.extend(top_level(3, &[0x08, 0x01, 0x12, 0x03, b'f', b'o', b'o']));
        body
    };
    let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        (
            "unsorted",
            v1(vec![series(&[("zone", "z"), ("__name__", "up")])]),
            expected(&[("__name__", "up"), ("namespace", "team-a"), ("zone", "z")]),
        ),
        (
            "the tenant label twice",
            v1(vec![series(&[
                ("namespace", "team-b"),
                ("namespace", "team-b"),
            ])]),
            expected(&[("namespace", "team-a")]),
        ),
        (
            "a label too long for a one-byte length",
            v1(vec![series(&[("__name__", &long)])]),
            expected(&[("__name__", &long), ("namespace", "team-a")]),
        ),
        (
            "a label after the others",
            label_last,
            expected(&[("namespace", "team-a"), ("zone", "z")]),
        ),
    ];
    for (layout, body, expected) in cases {
        let before = spliced_so_far();
        let (out, _) = rewrite(Version::V1, &body, &t).unwrap();
        assert_eq!(spliced_so_far(), before, "{layout}: not spliced");
        assert_eq!(out, expected, "{layout}");
    }
    let repeated = v1(vec![series(&[("a", "1"), ("a", "2")])]);
    assert!(matches!(
        rewrite(Version::V1, &repeated, &t),
        Err(RemoteWriteError::RepeatedLabel { .. })
    ));
}

/// The tenant label read by the general rewrite (its value written before
/// its name, which the short reader leaves to it) is judged by its value
/// like any other: an owned value other than the first is kept, under
/// either policy, and a foreign one is overwritten.
#[test]
fn v1_a_tenant_label_read_in_general_is_judged_by_its_value() {
    let owned = owned();
    let value_first = |value: &str| {
        let mut label = Vec::new();
        protowire::write_len_field(&mut label, 2, value.as_bytes());
        protowire::write_len_field(&mut label, 1, b"namespace");
        let mut bytes = Vec::new();
        protowire::write_len_field(&mut bytes, 1, &label);
        bytes.extend(series(&[("zone", "z")]).encode_to_vec());
        top_level(1, &bytes)
    };
    let as_encoders_write = |value: &str| {
        top_level(
            1,
            &series(&[("namespace", value), ("zone", "z")]).encode_to_vec(),
        )
    };
    for policy in [ForeignLabelPolicy::Overwrite, ForeignLabelPolicy::Reject] {
        let (out, stats) = rewrite(
            Version::V1,
            &value_first("team-a-2"),
            &tenant(&owned, policy),
        )
        .unwrap();
        assert_eq!(out, as_encoders_write("team-a-2"), "{policy:?}");
        assert_eq!((stats.added, stats.overwritten), (0, 0), "{policy:?}");
    }
    let overwrite = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let (out, stats) = rewrite(Version::V1, &value_first("team-b"), &overwrite).unwrap();
    assert_eq!(out, as_encoders_write("team-a"));
    assert_eq!(stats.overwritten, 1);
}

/// A series naming a label twice, sorted or not, in either version:
/// refused, as receivers answer it three ways (500, 204 with the series
/// dropped, 400). The tenant label named twice is resolved as before.
#[test]
fn a_series_naming_a_label_twice_is_refused() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let repeated = |version: Version, body: Vec<u8>| match rewrite(version, &body, &t) {
        Err(RemoteWriteError::RepeatedLabel { name, .. }) => name,
        other => panic!("{other:?}"),
    };
    for labels in [
        &[("__name__", "up"), ("job", "a"), ("job", "b")][..],
        &[("job", "a"), ("__name__", "up"), ("job", "a")],
        &[
            ("zone", "x"),
            ("job", "a"),
            ("zone", "x"),
            ("namespace", "team-a"),
        ],
    ] {
        let name = repeated(Version::V1, v1(vec![series(labels)]));
        assert!(name == "job" || name == "zone", "{name}");
        let name = repeated(Version::V2, v2_request(&[labels]).encode_to_vec());
        assert!(name == "job" || name == "zone", "{name}");
    }
    let error = RemoteWriteError::RepeatedLabel {
        name: "job".into(),
        series: "{job=\"a\"}".into(),
    };
    assert!(error.to_string().contains("has the label \"job\" twice"));
    let tenant_twice = [
        ("__name__", "up"),
        ("namespace", "team-a"),
        ("namespace", "team-b"),
    ];
    // Two values, one of them foreign: overwritten (one copy, the owned
    // value), or refused under `reject`, as a foreign value alone would be.
    let (out, stats) = rewrite_v1_ok(
        &v1(vec![series(&tenant_twice)]),
        ForeignLabelPolicy::Overwrite,
    );
    assert_eq!(
        pairs(&out.timeseries[0]),
        p(&[("__name__", "up"), ("namespace", "team-a")])
    );
    assert_eq!(stats.overwritten, 1);
    let rejecting = tenant(&owned, ForeignLabelPolicy::Reject);
    let v2_body = v2_request(&[&tenant_twice]).encode_to_vec();
    assert!(rewrite(Version::V2, &v2_body, &t).is_ok());
    for (version, body) in [
        (Version::V1, v1(vec![series(&tenant_twice)])),
        (Version::V2, v2_body),
    ] {
        let refused = rewrite(version, &body, &rejecting);
        assert!(
            matches!(refused, Err(RemoteWriteError::ForeignLabel(_))),
            "{refused:?}"
        );
    }
    // The same owned value twice is that value, kept.
    let owned_twice = [
        ("__name__", "up"),
        ("namespace", "team-a"),
        ("namespace", "team-a"),
    ];
    let (out, stats) = rewrite_v1_ok(&v1(vec![series(&owned_twice)]), ForeignLabelPolicy::Reject);
    assert_eq!(
        pairs(&out.timeseries[0]),
        p(&[("__name__", "up"), ("namespace", "team-a")])
    );
    assert_eq!((stats.added, stats.overwritten), (0, 0));
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
    let RemoteWriteError::ForeignLabel(ForeignLabel(series)) = err else {
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
    // 2.0: no series, so none of the tenant label's symbols either; a body
    // of symbols alone goes out as it came.
    let only_symbols = v2::Request {
        symbols: vec!["".into(), "job".into(), "team-b".into()],
        ..Default::default()
    }
    .encode_to_vec();
    for body in [&[][..], &only_symbols] {
        let (out, stats) = rewrite(
            Version::V2,
            body,
            &tenant(&owned, ForeignLabelPolicy::Overwrite),
        )
        .unwrap();
        assert_eq!(out, body);
        assert_eq!(stats, Stats::default());
    }
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
            created_timestamp: 1_699_999_000_000,
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
    assert_eq!(
        (stats.series, stats.samples, stats.added, stats.overwritten),
        (3, 3, 1, 1)
    );
}

/// The one series of `input` with its label references written as
/// `layout` says: each entry a field, packed with that many references, or
/// unpacked (0: one reference as a varint field).
fn v2_body_with_refs_in_fields(input: &v2::Request, layout: &[usize]) -> Vec<u8> {
    let mut series = input.timeseries[0].clone();
    let refs = std::mem::take(&mut series.labels_refs);
    let mut rest = &refs[..];
    let mut fields = Vec::new();
    for &count in layout {
        if count == 0 {
            protowire::write_varint(&mut fields, u64::from(1u32 << 3 | u32::from(VARINT)));
            protowire::write_varint(&mut fields, u64::from(rest[0]));
            rest = &rest[1..];
        } else {
            let mut packed = Vec::new();
            for &reference in &rest[..count] {
                protowire::write_varint(&mut packed, u64::from(reference));
            }
            protowire::write_len_field(&mut fields, 1, &packed);
            rest = &rest[count..];
        }
    }
    assert!(rest.is_empty(), "the layout places every reference");
    fields.extend_from_slice(&series.encode_to_vec());
    let mut body = v2::Request {
        symbols: input.symbols.clone(),
        timeseries: vec![],
    }
    .encode_to_vec();
    body.extend_from_slice(&top_level(5, &fields));
    body
}

#[test]
fn v2_reads_label_references_however_the_fields_split_them() {
    // Protobuf decoders accept a repeated number unpacked (one field per
    // value) as well as packed, and join repeated fields of either kind,
    // even between a label's name and its value: a receiver reads these
    // labels, so the proxy must too.
    let input = v2_request(&[&[("__name__", "up"), ("job", "api"), ("namespace", "team-b")]]);
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let packed_once = rewrite(Version::V2, &input.encode_to_vec(), &t).unwrap().0;
    for layout in [
        &[0, 0, 0, 0, 0, 0][..], // unpacked
        &[1, 5],                 // a name, then its value with the rest
        &[3, 3],
        &[2, 0, 3],
        &[0, 2, 0, 1, 1],
    ] {
        let body = v2_body_with_refs_in_fields(&input, layout);
        let (out, stats) = rewrite(Version::V2, &body, &t).unwrap();
        assert_eq!(
            v2_labels(&v2::Request::decode(out.as_slice()).unwrap(), 0),
            p(&[("__name__", "up"), ("job", "api"), ("namespace", "team-a")]),
            "{layout:?}"
        );
        assert_eq!((stats.series, stats.overwritten), (1, 1), "{layout:?}");
        // Rewritten exactly as the same series packed in one field.
        assert_eq!(out, packed_once, "{layout:?}");
    }
    // A name left without its value, wherever the fields end, is refused.
    let mut odd = input.clone();
    odd.timeseries[0].labels_refs.pop();
    for layout in [&[5][..], &[4, 1], &[4, 0], &[3, 0, 1]] {
        let body = v2_body_with_refs_in_fields(&odd, layout);
        assert_eq!(
            rewrite(Version::V2, &body, &t).unwrap_err().to_string(),
            "cannot decode remote-write body: odd number of label references",
            "{layout:?}"
        );
    }
}

/// `value` as a varint `extra` bytes longer than it needs (a continuation
/// byte of zero bits each): legal protobuf, not what an encoder writes.
fn stretched_varint(out: &mut Vec<u8>, value: u64, extra: usize) {
    let mut buf = [0; 10];
    let n = protowire::encode_varint(value, &mut buf);
    if extra == 0 {
        out.extend_from_slice(&buf[..n]);
        return;
    }
    buf[n - 1] |= 0x80;
    out.extend_from_slice(&buf[..n]);
    out.extend(std::iter::repeat_n(0x80, extra - 1));
    out.push(0);
}

/// A 2.0 body of one series, its labels as `pairs` of symbols, each
/// reference written `stretch[i]` bytes longer than it needs; `padding`
/// unused symbols first, so references take one, two or three bytes.
fn v2_body_with_refs(pairs: &[(&str, &str)], padding: usize, stretch: &[usize]) -> Vec<u8> {
    let mut symbols: Vec<String> = vec![String::new()];
    symbols.extend((0..padding).map(|i| format!("pad-{i}")));
    let mut packed = Vec::new();
    for (i, text) in pairs.iter().flat_map(|(n, v)| [*n, *v]).enumerate() {
        let reference = match symbols.iter().position(|s| s == text) {
            Some(r) => r,
            None => {
                symbols.push(text.to_string());
                symbols.len() - 1
            }
        };
        let extra = stretch.get(i).copied().unwrap_or(0);
        stretched_varint(&mut packed, reference as u64, extra);
    }
    let mut series = top_level(1, &packed);
    series.extend_from_slice(
        &v2::TimeSeries {
            samples: vec![v2::Sample {
                value: 1.0,
                timestamp: 1_700_000_000_000,
            }],
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let mut body = v2::Request {
        symbols,
        timeseries: vec![],
    }
    .encode_to_vec();
    body.extend_from_slice(&top_level(5, &series));
    body
}

/// The label references of a rewritten 2.0 body's first series, as the
/// packed field's bytes.
fn first_series_packed_refs(body: &[u8]) -> Vec<u8> {
    let series = fields(body)
        .map(Result::unwrap)
        .find(|f| f.tag == 5)
        .unwrap();
    let refs = fields(series.payload)
        .map(Result::unwrap)
        .find(|f| f.tag == 1)
        .unwrap();
    refs.payload.to_vec()
}

proptest! {
    /// A series sent sorted has its references copied from the sender's
    /// bytes where they can be: what leaves must be the labels expected
    /// (the tenant's pair once, in its place) written the shortest way,
    /// whatever length the sender's varints took.
    #[test]
    fn a_sorted_series_leaves_its_labels_in_place_written_the_shortest_way(
        others in prop::collection::btree_set(
            prop::sample::select(vec!["__name__", "a", "job", "nam", "namespace2", "o", "zone"]),
            0..6),
        tenant_values in prop::collection::vec(
            (0..7usize, prop::sample::select(vec!["team-a", "team-a-2", "team-b", ""])),
            0..3),
        padding in prop::sample::select(vec![0usize, 40, 300, 17_000]),
        stretch in prop::collection::vec(prop::sample::select(vec![0usize, 0, 0, 1, 2]), 0..20),
        reject in any::<bool>(),
    ) {
        let mut pairs: Vec<(&str, &str)> = others.iter().map(|n| (*n, "v")).collect();
        for (at, value) in &tenant_values {
            pairs.insert((*at).min(pairs.len()), ("namespace", *value));
        }
        let owned = owned();
        let policy = if reject { ForeignLabelPolicy::Reject } else { ForeignLabelPolicy::Overwrite };
        let body = v2_body_with_refs(&pairs, padding, &stretch);
        let spliced_before = spliced_so_far();
        let rewritten = rewrite(Version::V2, &body, &tenant(&owned, policy));
        // Copied in runs exactly when every reference was written shortest
        // (the other labels are sorted: a set's order) and the series kept.
        let shortest = stretch.iter().take(2 * pairs.len()).all(|&extra| extra == 0);
        prop_assert_eq!(
            spliced_so_far() - spliced_before,
            usize::from(shortest && rewritten.is_ok())
        );
        let Ok((out, _)) = rewritten else {
            prop_assert!(reject || tenant_values.iter().any(|(_, v)| *v != tenant_values[0].1));
            return Ok(());
        };
        let decoded = v2::Request::decode(out.as_slice()).unwrap();
        let values: Vec<&str> = tenant_values.iter().map(|(_, v)| *v).collect();
        let kept = match values.first() {
            Some(v) if OWNED.contains(v) && values.iter().all(|w| w == v) => *v,
            _ => "team-a",
        };
        let mut expected: Vec<(String, String)> =
            others.iter().map(|n| (n.to_string(), "v".to_string())).collect();
        expected.push(("namespace".into(), kept.into()));
        expected.sort();
        prop_assert_eq!(v2_labels(&decoded, 0), expected);
        let mut shortest = Vec::new();
        for reference in &decoded.timeseries[0].labels_refs {
            protowire::write_varint(&mut shortest, u64::from(*reference));
        }
        prop_assert_eq!(first_series_packed_refs(&out), shortest);
    }
}

/// Series this thread's rewrites have spliced so far.
fn spliced_so_far() -> usize {
    SPLICED.with(std::cell::Cell::get)
}

/// What encoders send (prost here: sorted labels, one packed field of
/// shortest varints), with references of one, two and three bytes: every
/// series takes the splice, with a foreign value or the tenant's own.
#[test]
fn an_encoders_sorted_series_have_their_references_copied_in_runs() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    // Two new symbols a series: past 16,384 symbols, references take three bytes.
    let values: Vec<(String, String)> = (0..9_000)
        .map(|i| (format!("value-{i}"), format!("other-{i}")))
        .collect();
    for namespace in ["team-b", "team-a"] {
        let series: Vec<Vec<(&str, &str)>> = values
            .iter()
            .map(|(v, w)| {
                vec![
                    ("__name__", "up"),
                    ("a", v),
                    ("namespace", namespace),
                    ("z", w),
                ]
            })
            .collect();
        let series: Vec<&[(&str, &str)]> = series.iter().map(Vec::as_slice).collect();
        let body = v2_request(&series).encode_to_vec();
        let before = spliced_so_far();
        let (out, stats) = rewrite(Version::V2, &body, &t).unwrap();
        assert_eq!(spliced_so_far() - before, values.len());
        assert_eq!(stats.series, values.len() as u64);
        let decoded = v2::Request::decode(out.as_slice()).unwrap();
        let last = decoded.timeseries.len() - 1;
        assert_eq!(
            v2_labels(&decoded, last),
            [
                ("__name__", "up"),
                ("a", "value-8999"),
                ("namespace", "team-a"),
                ("z", "other-8999")
            ]
            .map(|(n, v)| (n.to_string(), v.to_string()))
        );
    }
}

/// As in 1.0, a 2.0 body is copied only from the first series that
/// changes: symbols and series before and between changed ones go out as
/// they came, in their places.
#[test]
fn v2_fields_between_changed_series_go_out_as_they_came_in_their_places() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let ready: &[(&str, &str)] = &[("__name__", "up"), ("namespace", "team-a")];
    let input = v2_request(&[ready, &[("__name__", "up"), ("pod", "p")], ready]);
    let field = |tag, payload: &[u8]| top_level(tag, payload);
    let symbols: Vec<_> = input
        .symbols
        .iter()
        .map(|s| field(4, s.as_bytes()))
        .collect();
    let series: Vec<_> = input.timeseries.iter().map(|s| s.encode_to_vec()).collect();
    let (ready_field, unlabelled) = (field(5, &series[0]), field(5, &series[1]));
    // Every symbol it needs is in the table: only the series changes.
    let mut labelled = input.timeseries[1].clone();
    let at = |s: &str| input.symbols.iter().position(|x| x == s).unwrap() as u32;
    labelled.labels_refs = ["__name__", "up", "namespace", "team-a", "pod", "p"]
        .map(at)
        .to_vec();
    let labelled = field(5, &labelled.encode_to_vec());
    let mut stretched = vec![0x2a];
    stretched_varint(&mut stretched, series[2].len() as u64, 1);
    stretched.extend_from_slice(&series[2]);
    let shortest = field(5, &series[2]);

    let (head, tail) = (symbols[..4].concat(), symbols[4..].concat());
    let sent = [&head[..], &ready_field, &unlabelled, &tail, &stretched].concat();
    let expected = [&head[..], &ready_field, &labelled, &tail, &shortest].concat();
    let (out, stats) = rewrite(Version::V2, &sent, &t).unwrap();
    assert_eq!((out, stats.series, stats.added), (expected, 3, 1));

    // Nothing to change: nothing copied, the body forwarded as it came.
    let sent = [&head[..], &ready_field, &tail, &shortest].concat();
    let compressed = snap::raw::Encoder::new().compress_vec(&sent).unwrap();
    let (out, stats) =
        rewrite_body(Version::V2, &compressed, &t, 1 << 20, Output::Compressed).unwrap();
    assert_eq!((out, stats.series), (Rewritten::Unchanged, 2));
    assert_eq!(rewrite(Version::V2, &sent, &t).unwrap().0, sent);
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

#[test]
fn a_reference_one_past_the_senders_symbols_is_refused() {
    // The proxy appends the tenant label's name to the table: a reference
    // to where it will be must not pass as the sender's own.
    let input = v2_request(&[&[("__name__", "up")]]);
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let refs = |name: u32, value: u32| {
        let mut input = input.clone();
        input.timeseries[0].labels_refs.extend([name, value]);
        rewrite(Version::V2, &input.encode_to_vec(), &t)
    };
    let last = input.symbols.len() as u32 - 1;
    assert!(refs(last, last).is_ok());
    for (name, value) in [(last + 1, last), (last, last + 1)] {
        assert_eq!(
            refs(name, value),
            Err(RemoteWriteError::Malformed(
                "label reference outside the symbols table".into()
            ))
        );
    }
}

#[test]
fn a_thread_keeps_buffers_of_a_usual_batch_and_releases_an_unusually_large_ones() {
    // Each test runs on a thread of its own: the scratch buffers here are
    // this test's.
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let compressed_of = |value_bytes: usize| {
        let raw = v1(vec![series(&[("big", &"x".repeat(value_bytes))])]);
        snap::raw::Encoder::new().compress_vec(&raw).unwrap()
    };
    let capacities = || {
        SCRATCH.with(|s| {
            let s = s.borrow();
            [
                s.decompressed.capacity(),
                s.rewritten.capacity(),
                s.recompressed.capacity(),
            ]
        })
    };
    // The 4 MiB edge itself is `release_large_scratch`'s test; this one
    // shows `rewrite_body` hands it all three buffers.
    // 2 MiB, under the 4 MiB kept: every buffer stays for the next request.
    let usual = compressed_of(2 << 20);
    assert!(rewrite_body(Version::V1, &usual, &t, 64 << 20, Output::Compressed).is_ok());
    assert!(
        capacities().iter().all(|c| *c >= 2 << 20),
        "{:?}",
        capacities()
    );
    // 6 MiB: released, so one large batch does not pin its size.
    let large = compressed_of(6 << 20);
    assert!(rewrite_body(Version::V1, &large, &t, 64 << 20, Output::Compressed).is_ok());
    assert_eq!(capacities(), [0, 0, 0]);
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
    let v = |ct| read_headers(&headers(ct, None));
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
    // Media types are case-insensitive (RFC 9110); parameters are not read
    // loosely: Prometheus 3 takes `PROTO=` for no parameter at all (1.0).
    assert_eq!(v(Some("Application/X-Protobuf")), Ok(Version::V1));
    assert_eq!(
        v(Some(
            "APPLICATION/X-PROTOBUF;proto=io.prometheus.write.v2.Request"
        )),
        Ok(Version::V2)
    );
    for bad in [
        "application/x-protobuf; proto=io.prometheus.write.v2.Request",
        "application/x-protobuf;PROTO=io.prometheus.write.v2.Request",
        "application/x-protobuf;proto=io.prometheus.write.v2.request",
        "application/x-protobuf;proto=io.prometheus.write.v3.Request",
        "application/x-protobuf;charset=utf-8",
        "application/x-protobuf;proto=prometheus.WriteRequest;proto=io.prometheus.write.v2.Request",
        "application/json",
        "multipart/form-data",
    ] {
        assert!(
            matches!(v(Some(bad)), Err(RemoteWriteError::Unsupported(_))),
            "{bad}"
        );
    }
}

/// Header mode's reading: whatever a receiver would make of the headers,
/// did the sender mean 2.0 (and so expect the 2.0 confirmation)?
#[test]
fn a_sender_expects_2_0_by_any_spelling_of_either_header() {
    let expects = |pairs: &[(&'static str, &'static str)]| {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_static(value));
        }
        sender_expects_v2(&h)
    };
    for meant_v2 in [
        &[(
            "content-type",
            "application/x-protobuf;proto=io.prometheus.write.v2.Request",
        )][..],
        &[(
            "content-type",
            "application/x-protobuf; PROTO=IO.PROMETHEUS.WRITE.V2.REQUEST",
        )],
        &[
            ("content-type", "text/plain"),
            ("content-type", "x;proto=io.prometheus.write.v2.Request"),
        ],
        &[("x-prometheus-remote-write-version", "2.0.0")],
        &[("x-prometheus-remote-write-version", " 2.1")],
    ] {
        assert!(expects(meant_v2), "{meant_v2:?}");
    }
    for meant_v1 in [
        &[][..],
        &[("content-type", "application/x-protobuf")],
        &[(
            "content-type",
            "application/x-protobuf;proto=prometheus.WriteRequest",
        )],
        &[("x-prometheus-remote-write-version", "0.1.0")],
    ] {
        assert!(!expects(meant_v1), "{meant_v1:?}");
    }
}

#[test]
fn content_coding_is_snappy_in_any_case_and_nothing_else() {
    let ct = Some("application/x-protobuf");
    for good in [None, Some("snappy"), Some("SNAPPY"), Some("Snappy")] {
        assert_eq!(
            read_headers(&headers(ct, good)),
            Ok(Version::V1),
            "{good:?}"
        );
    }
    for bad in ["identity", "gzip", "zstd", "snappy, gzip", ""] {
        let Err(RemoteWriteError::Unsupported(reason)) = read_headers(&headers(ct, Some(bad)))
        else {
            panic!("{bad:?} must be refused");
        };
        assert!(
            reason.contains("snappy"),
            "the reason says what is expected: {reason}"
        );
    }
}

#[test]
fn a_repeated_content_type_or_coding_is_refused() {
    // Receivers differ on which copy they read: Go's Header.Get takes the first.
    for (name, first, second) in [
        (
            header::CONTENT_TYPE,
            "application/x-protobuf",
            V2_CONTENT_TYPE,
        ),
        (
            header::CONTENT_TYPE,
            V2_CONTENT_TYPE,
            "application/x-protobuf",
        ),
        (header::CONTENT_ENCODING, "snappy", "snappy"),
    ] {
        let mut h = headers(None, None);
        h.append(&name, HeaderValue::from_static(first));
        h.append(&name, HeaderValue::from_static(second));
        assert!(
            matches!(read_headers(&h), Err(RemoteWriteError::Unsupported(m)) if m.contains("more than one")),
            "{name}: {first} + {second}"
        );
    }
}

#[test]
fn upstream_headers_are_the_canonical_spelling_of_what_was_read() {
    let mut h = headers(Some("Application/X-Protobuf"), Some("SNAPPY"));
    h.append(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    set_upstream_headers(Version::V1, &mut h);
    assert_eq!(h.get_all(header::CONTENT_TYPE).iter().count(), 1);
    assert_eq!(h[header::CONTENT_TYPE], "application/x-protobuf");
    assert_eq!(h.get_all(header::CONTENT_ENCODING).iter().count(), 1);
    assert_eq!(h[header::CONTENT_ENCODING], "snappy");
    assert_eq!(h["x-prometheus-remote-write-version"], "0.1.0");
    set_upstream_headers(Version::V2, &mut h);
    assert_eq!(h[header::CONTENT_TYPE], V2_CONTENT_TYPE);
    assert_eq!(h["x-prometheus-remote-write-version"], "2.0.0");
    assert_eq!(
        read_headers(&h),
        Ok(Version::V2),
        "and reads back as it was decided"
    );
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
    let h = Version::V1;
    assert!(rewrite_body(h, &compressed, &t, 100_000, Output::Compressed).is_ok());
    // The limit is the largest size accepted, not the first refused.
    assert!(rewrite_body(h, &compressed, &t, raw.len() as u64, Output::Compressed).is_ok());
    assert_eq!(
        rewrite_body(h, &compressed, &t, 1_000, Output::Compressed),
        Err(RemoteWriteError::TooLarge {
            size: raw.len() as u64,
            limit: 1_000
        })
    );
    // A snappy header claiming 4 GiB is refused without allocating it.
    let bomb = [0xff, 0xff, 0xff, 0xff, 0x0f, 0x00];
    assert!(matches!(
        rewrite_body(h, &bomb, &t, 1 << 26, Output::Compressed),
        Err(RemoteWriteError::TooLarge { .. })
    ));
    assert!(matches!(
        rewrite_body(
            h,
            &compressed[..compressed.len() / 2],
            &t,
            100_000,
            Output::Compressed
        ),
        Err(RemoteWriteError::Malformed(_))
    ));
    // Snappy's framing format is not remote write's block format.
    let mut framed = SNAPPY_FRAMED_STREAM.to_vec();
    framed.extend_from_slice(&compressed);
    assert!(matches!(
        rewrite_body(h, &framed, &t, 100_000, Output::Compressed),
        Err(RemoteWriteError::Malformed(m)) if m.contains("framing")
    ));
}

/// A body that needs no change is forwarded as it came, however rewritten
/// bodies are written; one that does decodes to the same message whether
/// compressed or written as literals, and as literals is not compressed.
#[test]
fn a_body_that_needs_no_change_is_forwarded_as_it_came() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let h = Version::V1;
    let compress = |raw: &[u8]| snap::raw::Encoder::new().compress_vec(raw).unwrap();
    let ready = compress(&v1(vec![
        series(&[("__name__", "up"), ("namespace", "team-a")]),
        series(&[("__name__", "up"), ("namespace", "team-a-2"), ("pod", "p")]),
    ]));
    for output in [Output::Compressed, Output::Literal] {
        let (out, stats) = rewrite_body(h, &ready, &t, 1 << 20, output).unwrap();
        assert_eq!(out, Rewritten::Unchanged);
        assert_eq!((stats.series, stats.added, stats.overwritten), (2, 0, 0));
    }

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
        let forwarded = |output| {
            let (out, _) = rewrite_body(h, &compress(&raw), &t, 1 << 20, output).unwrap();
            let Rewritten::Body(body) = out else {
                panic!("{needs_work:?} must be rewritten");
            };
            let message = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
            (body, message)
        };
        let (_, message) = forwarded(Output::Compressed);
        let sent = WriteRequest::decode(message.as_slice()).unwrap();
        let namespaces: Vec<_> = sent.timeseries[1]
            .labels
            .iter()
            .filter(|l| l.name == "namespace")
            .map(|l| l.value.as_str())
            .collect();
        assert!(matches!(namespaces[..], ["team-a"]), "{needs_work:?}");
        let (literals, as_literals) = forwarded(Output::Literal);
        assert_eq!(as_literals, message, "{needs_work:?}");
        assert!(literals.len() > message.len(), "{needs_work:?}");
    }
}

/// A 1.0 body is copied only from the first field that changes: the fields
/// before it and between changed ones go out as they came, in their places,
/// whatever kind they are and whichever way their series were read.
#[test]
fn v1_fields_between_changed_series_go_out_as_they_came_in_their_places() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let field = |tag, payload: &[u8]| top_level(tag, payload);
    let metadata = |help: &[u8]| field(3, &[&[0x08, 0x01, 0x12, help.len() as u8], help].concat());
    let ready = series(&[("__name__", "up"), ("namespace", "team-a")]).encode_to_vec();
    let unlabelled = series(&[("__name__", "up"), ("pod", "p")]).encode_to_vec();
    let labelled = series(&[("__name__", "up"), ("namespace", "team-a"), ("pod", "p")]);
    // Read by the general rewrite (a value too long for a one-byte
    // length), and written as it came.
    let long = "v".repeat(200);
    let long_ready =
        series(&[("__name__", "up"), ("namespace", "team-a"), ("z", &long)]).encode_to_vec();
    // Ready, but its length written in two bytes where one does: written
    // again the shortest way.
    let mut stretched = vec![0x0a];
    stretched_varint(&mut stretched, ready.len() as u64, 1);
    stretched.extend_from_slice(&ready);

    let [m1, m2, a, b, c, e] = [
        metadata(b"one"),
        metadata(b"two"),
        field(1, &ready),
        field(1, &unlabelled),
        field(1, &long_ready),
        field(1, &ready),
    ];
    let b_out = field(1, &labelled.encode_to_vec());
    let d_out = field(1, &ready);
    for (sent, expected) in [
        (
            vec![
                &m1[..],
                &a[..],
                &b[..],
                &m2[..],
                &c[..],
                &stretched[..],
                &e[..],
            ],
            vec![
                &m1[..],
                &a[..],
                &b_out[..],
                &m2[..],
                &c[..],
                &d_out[..],
                &e[..],
            ],
        ),
        (
            vec![&b[..], &a[..], &m1[..]],
            vec![&b_out[..], &a[..], &m1[..]],
        ),
        (
            vec![&a[..], &m1[..], &c[..], &b[..]],
            vec![&a[..], &m1[..], &c[..], &b_out[..]],
        ),
    ] {
        let body = sent.concat();
        let (out, stats) = rewrite(Version::V1, &body, &t).unwrap();
        assert_eq!(out, expected.concat(), "{sent:?}");
        let series_sent = sent.iter().filter(|f| f[0] == 0x0a).count() as u64;
        assert_eq!((stats.series, stats.added), (series_sent, 1), "{sent:?}");
        let compressed = snap::raw::Encoder::new().compress_vec(&body).unwrap();
        let (Rewritten::Body(forwarded), _) =
            rewrite_body(Version::V1, &compressed, &t, 1 << 20, Output::Compressed).unwrap()
        else {
            panic!("{sent:?} needs a change");
        };
        let forwarded = snap::raw::Decoder::new()
            .decompress_vec(&forwarded)
            .unwrap();
        assert_eq!(forwarded, expected.concat(), "{sent:?}");
    }

    // Nothing to change: nothing copied, the body forwarded as it came.
    let body = [&m1[..], &a[..], &c[..], &m2[..], &e[..]].concat();
    let compressed = snap::raw::Encoder::new().compress_vec(&body).unwrap();
    let (out, stats) =
        rewrite_body(Version::V1, &compressed, &t, 1 << 20, Output::Compressed).unwrap();
    assert_eq!((out, stats.series), (Rewritten::Unchanged, 3));
    assert_eq!(rewrite(Version::V1, &body, &t).unwrap().0, body);
}

// === one body, one reading: what is forwarded means the same to every receiver ===

/// The push that reached another tenant (issue #13): 1.0 bytes declared
/// 2.0. A 1.0-only receiver ignores `proto=` and stored the series under
/// team-b, because the 2.0 rewrite copied field 1 as unknown.
fn v1_bytes_for_team_b() -> Vec<u8> {
    v1(vec![series(&[
        ("__name__", "escape_marker"),
        ("namespace", "team-b"),
    ])])
}

fn refused_field(result: Result<(Vec<u8>, Stats), RemoteWriteError>) -> (u32, &'static str) {
    match result {
        Err(RemoteWriteError::UnexpectedField { tag, other, .. }) => (tag, other),
        other => panic!("expected an unexpected-field refusal, got {other:?}"),
    }
}

#[test]
fn a_1_0_body_declared_2_0_is_refused_not_forwarded() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let body = v1_bytes_for_team_b();
    assert_eq!(
        refused_field(rewrite(Version::V2, &body, &t)),
        (1, " (it is 1.0's timeseries)")
    );
    // Even behind valid 2.0 content, and with metadata only.
    let mut mixed = v2_request(&[&[("__name__", "up")]]).encode_to_vec();
    mixed.extend_from_slice(&body);
    assert_eq!(refused_field(rewrite(Version::V2, &mixed, &t)).0, 1);
    let metadata_only = WriteRequest {
        timeseries: vec![],
        metadata: vec![vec![0x08, 0x01]],
    };
    assert_eq!(
        refused_field(rewrite(Version::V2, &metadata_only.encode_to_vec(), &t)),
        (3, " (it is 1.0's metadata)")
    );
    // The message says why, so a sender's operator can act on it.
    let message = rewrite(Version::V2, &body, &t).unwrap_err().to_string();
    assert!(
        message.contains("remote write 2.0 Request: field 1"),
        "{message}"
    );
    assert!(message.contains("1.0's timeseries"), "{message}");
}

#[test]
fn a_2_0_body_declared_1_0_is_refused_not_forwarded() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let v2_body = v2_request(&[&[("__name__", "up"), ("namespace", "team-b")]]).encode_to_vec();
    assert_eq!(
        refused_field(rewrite(Version::V1, &v2_body, &t)),
        (4, " (it is 2.0's symbols)")
    );
    let mut mixed = v1(vec![series(&[("__name__", "up")])]);
    let series_only = v2::Request {
        symbols: vec![],
        ..v2_request(&[&[("__name__", "up")]])
    };
    mixed.extend_from_slice(&series_only.encode_to_vec());
    assert_eq!(
        refused_field(rewrite(Version::V1, &mixed, &t)),
        (5, " (it is 2.0's timeseries)")
    );
}

#[test]
fn unknown_and_mistyped_top_level_fields_are_refused_in_both_versions() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let varint_field = |tag: u32| {
        let mut b = Vec::new();
        protowire::write_varint(&mut b, u64::from(tag) << 3);
        protowire::write_varint(&mut b, 1);
        b
    };
    for (version, tag) in [
        (Version::V1, 2), // Cortex's `source`, reserved in Prometheus
        (Version::V1, 1), // timeseries, but as a varint
        (Version::V1, 1000),
        (Version::V2, 2),
        (Version::V2, 5), // timeseries, but as a varint
        (Version::V2, 6),
    ] {
        assert_eq!(
            refused_field(rewrite(version, &varint_field(tag), &t)).0,
            tag,
            "{version:?}"
        );
    }
}

/// A series with one extra field appended.
fn with_field(mut series: Vec<u8>, tag: u32, wire_type: u8) -> Vec<u8> {
    protowire::write_varint(&mut series, (u64::from(tag) << 3) | u64::from(wire_type));
    match wire_type {
        VARINT => protowire::write_varint(&mut series, 7),
        LEN => {
            protowire::write_varint(&mut series, 3);
            series.extend_from_slice(b"\x0a\x01x");
        }
        protowire::FIXED64 => series.extend_from_slice(&[0; 8]),
        _ => series.extend_from_slice(&[0; 4]),
    }
    series
}

fn top_level(tag: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    protowire::write_len_field(&mut out, tag, payload);
    out
}

#[test]
fn a_field_no_schema_defines_inside_a_series_is_dropped_not_forwarded() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let plain = series(&[("__name__", "up"), ("namespace", "team-a")]).encode_to_vec();
    // Field 9 could be anything to a future receiver, a label among others.
    let body = top_level(1, &with_field(plain.clone(), 9, LEN));
    let (out, stats) = rewrite(Version::V1, &body, &t).unwrap();
    assert_eq!(stats.dropped_fields, 1);
    assert_eq!(
        out,
        top_level(1, &plain),
        "the series without field 9, nothing else changed"
    );

    let v2_series = v2_request(&[&[("__name__", "up"), ("namespace", "team-a")]]);
    let mut body = Vec::new();
    for symbol in &v2_series.symbols {
        protowire::write_len_field(&mut body, 4, symbol.as_bytes());
    }
    let ts = v2_series.timeseries[0].encode_to_vec();
    body.extend(top_level(5, &with_field(ts, 7, VARINT)));
    let (out, stats) = rewrite(Version::V2, &body, &t).unwrap();
    assert_eq!(stats.dropped_fields, 1);
    let decoded = v2::Request::decode(out.as_slice()).unwrap();
    assert_eq!(
        decoded.timeseries[0].created_timestamp, 1_699_999_000_000,
        "field 6 kept"
    );
    assert!(!out.windows(2).any(|w| w == [7 << 3, 7]), "field 7 gone");
}

#[test]
fn a_schema_field_with_the_wrong_wire_type_is_refused() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let plain = series(&[("__name__", "up")]).encode_to_vec();
    for tag in 1..=4 {
        let body = top_level(1, &with_field(plain.clone(), tag, VARINT));
        assert!(
            matches!(rewrite(Version::V1, &body, &t), Err(RemoteWriteError::Malformed(m)) if m.contains("wire type")),
            "1.0 field {tag}"
        );
    }
    let ts = v2_request(&[&[("__name__", "up")]]).timeseries[0].encode_to_vec();
    for (tag, wire_type) in [(2, VARINT), (5, VARINT), (6, LEN), (1, protowire::FIXED32)] {
        let mut body = top_level(4, b"");
        body.extend(top_level(5, &with_field(ts.clone(), tag, wire_type)));
        assert!(
            matches!(
                rewrite(Version::V2, &body, &t),
                Err(RemoteWriteError::Malformed(_))
            ),
            "2.0 field {tag}/{wire_type}"
        );
    }
}

#[test]
fn a_1_0_label_with_a_field_besides_name_and_value_is_refused() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    for extra_tag in [3, 15] {
        let mut label = Vec::new();
        protowire::write_len_field(&mut label, 1, b"job");
        protowire::write_len_field(&mut label, 2, b"a");
        protowire::write_len_field(&mut label, extra_tag, b"namespace");
        let mut ts = Vec::new();
        protowire::write_len_field(&mut ts, 1, &label);
        assert!(
            matches!(
                rewrite(Version::V1, &top_level(1, &ts), &t),
                Err(RemoteWriteError::Malformed(_))
            ),
            "field {extra_tag}"
        );
    }
}

#[test]
fn every_fuzz_seed_that_once_escaped_keeps_the_invariant() {
    // The same inputs seed fuzz/fuzz_targets/remote_write.rs.
    let seeds: [&[u8]; 3] = [
        include_bytes!("../../../../fuzz/corpus/remote_write/v1-bytes-declared-v2"),
        include_bytes!("../../../../fuzz/corpus/remote_write/v2-bytes-declared-v1"),
        include_bytes!("../../../../fuzz/corpus/remote_write/v1-and-v2-in-one-body"),
    ];
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    for (i, seed) in seeds.iter().enumerate() {
        let readable = readings::as_v1(seed)
            .into_iter()
            .chain(readings::as_v2(seed))
            .flatten();
        assert!(
            readable.count() > 0,
            "seed {i} holds a series some receiver reads"
        );
        for version in [Version::V1, Version::V2] {
            if let Ok((out, _)) = rewrite(version, seed, &t) {
                readings::only_owned_series(&out, "namespace", &owned)
                    .unwrap_or_else(|e| panic!("seed {i} as {version:?}: {e}"));
            }
        }
    }
    // The confusion of issue #13 is refused outright.
    assert!(rewrite(Version::V2, seeds[0], &t).is_err());
    assert!(rewrite(Version::V1, seeds[1], &t).is_err());
}

/// One top-level field of a generated body, from either schema or none.
#[derive(Debug, Clone)]
enum Piece {
    V1Series(Vec<(&'static str, &'static str)>, Option<(u32, u8)>),
    V1Metadata,
    V2Symbol(&'static str),
    V2Series(Vec<u32>, Option<(u32, u8)>),
    Other(u32, u8),
}

fn encode_pieces(pieces: &[Piece]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::V1Series(labels, extra) => {
                let mut ts = series(labels).encode_to_vec();
                if let Some((tag, wire)) = extra {
                    ts = with_field(ts, *tag, *wire);
                }
                protowire::write_len_field(&mut out, 1, &ts);
            }
            Piece::V1Metadata => protowire::write_len_field(&mut out, 3, &[0x08, 0x01]),
            Piece::V2Symbol(s) => protowire::write_len_field(&mut out, 4, s.as_bytes()),
            Piece::V2Series(refs, extra) => {
                let mut ts = v2::TimeSeries {
                    labels_refs: refs.clone(),
                    samples: vec![v2::Sample {
                        value: 1.0,
                        timestamp: 1,
                    }],
                    ..Default::default()
                }
                .encode_to_vec();
                if let Some((tag, wire)) = extra {
                    ts = with_field(ts, *tag, *wire);
                }
                protowire::write_len_field(&mut out, 5, &ts);
            }
            Piece::Other(tag, wire) => {
                out = with_field(out, *tag, *wire);
            }
        }
    }
    out
}

fn piece() -> impl Strategy<Value = Piece> {
    let name = prop::sample::select(vec!["__name__", "namespace", "job", ""]);
    let value = prop::sample::select(vec!["up", "team-a", "team-a-2", "team-b", ""]);
    let wire = prop::sample::select(vec![VARINT, LEN, protowire::FIXED32, protowire::FIXED64]);
    let extra = prop::option::of((1u32..10, wire.clone()));
    prop_oneof![
        (prop::collection::vec((name, value), 0..4), extra.clone())
            .prop_map(|(labels, extra)| Piece::V1Series(labels, extra)),
        Just(Piece::V1Metadata),
        prop::sample::select(vec!["", "__name__", "up", "namespace", "team-a", "team-b"])
            .prop_map(Piece::V2Symbol),
        (prop::collection::vec(0u32..8, 0..6), extra)
            .prop_map(|(refs, extra)| Piece::V2Series(refs, extra)),
        ((1u32..8), wire).prop_map(|(tag, wire)| Piece::Other(tag, wire)),
    ]
}

// === properties ===

/// Label names that often share a prefix, reach eight bytes and beyond,
/// and hold the bytes zero padding could be confused with.
fn label_name_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(0xff), any::<u8>()];
    (
        prop::sample::select(vec![&b""[..], b"label_", b"namespac", b"__name__"]),
        prop::collection::vec(byte, 0..6),
    )
        .prop_map(|(prefix, rest)| [prefix, &rest].concat())
}

proptest! {
    /// The shortcut the sort check uses orders names as the byte-wise
    /// comparison it replaces.
    #[test]
    fn label_names_order_as_their_bytes(a in label_name_bytes(), b in label_name_bytes()) {
        prop_assert_eq!(name_order(&a, &b), a.cmp(&b));
        prop_assert_eq!(name_order(&a, &a), std::cmp::Ordering::Equal);
    }

    /// Any bytes: an error or a body whose every series carries exactly one
    /// owned tenant label, with labels sorted. Never a panic.
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let owned = owned();
        let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
        let _ = rewrite(Version::V1, &bytes, &t);
        let _ = rewrite(Version::V2, &bytes, &t);
    }

    /// The differential property of issue #13: for every body the rewrite
    /// accepts, as either version, a 1.0 decoder and a 2.0 decoder of what
    /// is forwarded both find only series carrying one owned tenant label.
    #[test]
    fn every_reading_of_a_forwarded_body_finds_only_owned_series(
        pieces in prop::collection::vec(piece(), 0..8),
        reject in any::<bool>(),
    ) {
        let owned = owned();
        let policy = if reject { ForeignLabelPolicy::Reject } else { ForeignLabelPolicy::Overwrite };
        let body = encode_pieces(&pieces);
        for version in [Version::V1, Version::V2] {
            if let Ok((out, _)) = rewrite(version, &body, &tenant(&owned, policy)) {
                let scoped = readings::only_owned_series(&out, "namespace", &owned);
                prop_assert!(scoped.is_ok(), "{:?} accepted {:?}: {:?}", version, pieces, scoped);
            }
        }
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
        let v2_in = v2_request(&raw_series.iter().map(|s| s.as_slice()).collect::<Vec<_>>());
        let owned = owned();
        let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
        // A name other than the tenant label's given twice in a series.
        let repeats = raw_series.iter().any(|labels| {
            labels.iter().enumerate().any(|(i, (n, _))| {
                *n != "namespace" && labels[..i].iter().any(|(m, _)| m == n)
            })
        });
        if repeats {
            for (version, body) in [(Version::V1, body), (Version::V2, v2_in.encode_to_vec())] {
                let refused = matches!(
                    rewrite(version, &body, &t),
                    Err(RemoteWriteError::RepeatedLabel { .. })
                );
                prop_assert!(refused, "{:?}", version);
            }
            return Ok(());
        }
        // Every label but the tenant's, sorted: what must leave as it came.
        let others = |labels: Vec<(String, String)>| {
            let mut others: Vec<_> = labels.into_iter().filter(|(n, _)| n != "namespace").collect();
            others.sort();
            others
        };
        let came = |i: usize| others(p(&raw_series[i]));
        let (out, stats) = rewrite_v1_ok(&body, ForeignLabelPolicy::Overwrite);
        prop_assert_eq!(out.timeseries.len(), raw_series.len());
        prop_assert_eq!(stats.series as usize, raw_series.len());
        for (i, ts) in out.timeseries.iter().enumerate() {
            let ours: Vec<_> = ts.labels.iter().filter(|l| l.name == "namespace").collect();
            prop_assert_eq!(ours.len(), 1);
            prop_assert!(OWNED.contains(&ours[0].value.as_str()));
            prop_assert!(ts.labels.windows(2).all(|w| w[0].name < w[1].name));
            prop_assert_eq!(others(pairs(ts)), came(i));
            let unlabelled = TimeSeries { labels: vec![], ..ts.clone() };
            prop_assert_eq!(unlabelled, series(&[]), "samples, exemplars, histograms");
        }
        let (out, _) = rewrite(Version::V2, &v2_in.encode_to_vec(), &t).unwrap();
        let out = v2::Request::decode(out.as_slice()).unwrap();
        prop_assert_eq!(out.timeseries.len(), raw_series.len());
        for (i, ts) in out.timeseries.iter().enumerate() {
            let labels = v2_labels(&out, i);
            let ours: Vec<_> = labels.iter().filter(|(n, _)| n == "namespace").collect();
            prop_assert_eq!(ours.len(), 1);
            prop_assert!(OWNED.contains(&ours[0].1.as_str()));
            prop_assert!(labels.windows(2).all(|w| w[0].0 < w[1].0), "{:?}", labels);
            prop_assert_eq!(others(labels), came(i));
            let unlabelled = |ts: &v2::TimeSeries| v2::TimeSeries { labels_refs: vec![], ..ts.clone() };
            prop_assert_eq!(unlabelled(ts), unlabelled(&v2_in.timeseries[i]));
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

/// A snappy body's declared size is what it decompresses to; a header
/// that cannot be read declares nothing (the rewrite refuses it first).
#[test]
fn a_snappy_body_declares_what_it_decompresses_to() {
    let raw = vec![7u8; 3 << 20];
    let compressed = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
    assert_eq!(declared_size(&compressed), raw.len() as u64);
    assert_eq!(declared_size(&[0xff; 11]), 0);
    assert_eq!(declared_size(&[]), 0);
}
