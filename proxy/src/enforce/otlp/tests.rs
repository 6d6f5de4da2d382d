use super::*;
use crate::config::ForeignLabelPolicy;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use opentelemetry_proto::tonic::common::v1::AnyValue;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::metrics::v1::{
    exemplar, exponential_histogram_data_point, number_data_point, summary_data_point, Exemplar,
    ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram, HistogramDataPoint,
    Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use proptest::prelude::*;
use prost::Message;
use std::io::Read;

const LABEL: &str = "k8s_namespace_name";

fn owned() -> Vec<String> {
    vec!["team-a".into(), "team-a-2".into()]
}

fn tenant(owned: &[String], policy: ForeignLabelPolicy) -> TenantLabel<'_> {
    TenantLabel {
        name: LABEL,
        owned,
        owned_by: "team-a",
        policy,
    }
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

/// One metric of every type, each data point with `attributes` and every
/// other field a sender fills (timestamps, values, buckets, exemplars), so
/// that what the rewrite copies is there to be copied.
fn every_type(attributes: &[KeyValue]) -> Vec<Metric> {
    let a = attributes.to_vec();
    let metric = |name: &str, data| Metric {
        name: name.into(),
        description: format!("{name} described"),
        unit: "s".into(),
        metadata: vec![kv("origin", "sdk")],
        data: Some(data),
    };
    let (start, time) = (1_700_000_000_000_000_000, 1_700_000_015_000_000_000);
    let exemplar = Exemplar {
        filtered_attributes: vec![kv("http.route", "/cart")],
        time_unix_nano: time - 1,
        span_id: vec![1; 8],
        trace_id: vec![2; 16],
        value: Some(exemplar::Value::AsDouble(0.25)),
    };
    let number = |value| NumberDataPoint {
        attributes: a.clone(),
        start_time_unix_nano: start,
        time_unix_nano: time,
        exemplars: vec![exemplar.clone()],
        flags: 0,
        value: Some(value),
    };
    // Scale -2: buckets of base 16, (1/16, 1], (1, 16], (16, 256].
    let buckets = exponential_histogram_data_point::Buckets {
        offset: -1,
        bucket_counts: vec![3, 0, 200],
    };
    vec![
        metric(
            "g",
            Data::Gauge(Gauge {
                data_points: vec![number(number_data_point::Value::AsDouble(-1.5))],
            }),
        ),
        metric(
            "s",
            Data::Sum(Sum {
                data_points: vec![number(number_data_point::Value::AsInt(-300))],
                aggregation_temporality: 2,
                is_monotonic: true,
            }),
        ),
        metric(
            "h",
            Data::Histogram(Histogram {
                data_points: vec![HistogramDataPoint {
                    attributes: a.clone(),
                    start_time_unix_nano: start,
                    time_unix_nano: time,
                    count: 203,
                    sum: Some(412.5),
                    bucket_counts: vec![3, 0, 200],
                    explicit_bounds: vec![0.1, 1.0],
                    exemplars: vec![exemplar.clone()],
                    flags: 1,
                    min: Some(0.01),
                    max: Some(9.0),
                }],
                aggregation_temporality: 1,
            }),
        ),
        metric(
            "e",
            Data::ExponentialHistogram(ExponentialHistogram {
                data_points: vec![ExponentialHistogramDataPoint {
                    attributes: a.clone(),
                    start_time_unix_nano: start,
                    time_unix_nano: time,
                    count: 409, // 203 positive, 203 negative, 3 zero
                    sum: Some(7.5),
                    scale: -2,
                    zero_count: 3,
                    positive: Some(buckets.clone()),
                    negative: Some(buckets),
                    flags: 0,
                    exemplars: vec![exemplar],
                    min: Some(-200.0),
                    max: Some(200.0),
                    zero_threshold: 1e-9,
                }],
                aggregation_temporality: 2,
            }),
        ),
        metric(
            "q",
            Data::Summary(Summary {
                data_points: vec![SummaryDataPoint {
                    attributes: a,
                    start_time_unix_nano: start,
                    time_unix_nano: time,
                    count: 12,
                    sum: 3.5,
                    quantile_values: vec![summary_data_point::ValueAtQuantile {
                        quantile: 0.99,
                        value: 0.75,
                    }],
                    flags: 0,
                }],
            }),
        ),
    ]
}

fn request(
    resource: &[KeyValue],
    scope: &[KeyValue],
    points: &[KeyValue],
) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource.to_vec(),
                dropped_attributes_count: 1,
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "lib".into(),
                    version: "1.2.3".into(),
                    attributes: scope.to_vec(),
                    dropped_attributes_count: 2,
                }),
                metrics: every_type(points),
                schema_url: "https://opentelemetry.io/schemas/1.26.0".into(),
            }],
            schema_url: "https://opentelemetry.io/schemas/1.25.0".into(),
        }],
    }
}

fn scoped(request: &ExportMetricsServiceRequest, owned: &[String]) -> Result<(), String> {
    check_scoped(request, LABEL, owned)
}

/// Data-point attribute lists, in order.
fn points(request: &ExportMetricsServiceRequest) -> Vec<Vec<KeyValue>> {
    let metrics = &request.resource_metrics[0].scope_metrics[0].metrics;
    metrics
        .iter()
        .flat_map(data_point_attributes)
        .map(<[KeyValue]>::to_vec)
        .collect()
}

/// Rewrites a request on the wire and decodes what would be forwarded.
fn rewrite_decoded(
    request: &mut ExportMetricsServiceRequest,
    tenant: &TenantLabel<'_>,
) -> Result<Stats, OtlpError> {
    let (out, stats) = rewrite(&request.encode_to_vec(), tenant)?;
    *request = ExportMetricsServiceRequest::decode(out.as_slice()).expect("forwarded bytes decode");
    Ok(stats)
}

#[test]
fn names_that_translate_to_the_label_are_found_in_every_reading() {
    for key in [
        "k8s_namespace_name",
        "k8s.namespace.name",
        "k8s-namespace-name",
        "k8s/namespace name",
        "k8s..namespace.name",
        "k8s.namespace.nåme".replace('å', "a").as_str(),
    ] {
        assert!(translates_to(key, Level::DataPoint, LABEL), "{key}");
    }
    for key in [
        "k8s.namespace",
        "K8s.namespace.name",
        "k8s.namespace.name.x",
        "namespace",
    ] {
        assert!(!translates_to(key, Level::DataPoint, LABEL), "{key}");
    }
    assert!(translates_to("1x", Level::DataPoint, "key_1x"));
    assert!(translates_to("_x", Level::DataPoint, "key_x"));
    assert!(translates_to("service.name", Level::Resource, "job"));
    assert!(!translates_to("service.name", Level::DataPoint, "job"));
    assert!(translates_to(
        "k8s.namespace.name",
        Level::Scope,
        "otel_scope_k8s_namespace_name"
    ));
}

#[test]
fn every_data_point_of_every_type_and_every_resource_gets_the_label() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    // Five data points with these attributes and a resource with a foreign
    // value: the data points' label added, overwritten, kept (renamed), or
    // overwritten (the two would be joined by ';' there); and how many were
    // counted as added and overwritten, the resource's among them.
    for (points, added, overwritten) in [
        (vec![kv("job", "x")], 5, 1),
        (
            vec![kv("k8s.namespace.name", "team-b"), kv("job", "x")],
            0,
            6,
        ),
        (vec![kv("k8s.namespace.name", "team-a-2")], 0, 1),
        (
            vec![kv(LABEL, "team-a"), kv("k8s-namespace-name", "team-b")],
            0,
            6,
        ),
    ] {
        let mut r = request(
            &[
                kv("service.name", "svc"),
                kv("k8s.namespace.name", "team-b"),
            ],
            &[kv("k8s.namespace.name", "team-b")],
            &points,
        );
        let stats = rewrite_decoded(&mut r, &t).unwrap();
        assert_eq!(stats.data_points, 5);
        assert_eq!(
            (stats.added, stats.overwritten),
            (added, overwritten),
            "{points:?}"
        );
        scoped(&r, &owned).unwrap_or_else(|e| panic!("{points:?}: {e}"));
    }
    let mut kept = request(&[], &[], &[kv("k8s.namespace.name", "team-a-2")]);
    rewrite_decoded(&mut kept, &t).unwrap();
    assert_eq!(
        points(&kept).last().unwrap(),
        &vec![kv(LABEL, "team-a-2")],
        "an owned value is kept, under the exact name"
    );
    let resource = &kept.resource_metrics[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes;
    assert_eq!(
        resource,
        &vec![kv(LABEL, "team-a")],
        "the resource gets the first value"
    );
}

#[test]
fn the_invariant_finds_every_unscoped_place() {
    // `check_scoped` is what the property test and the fuzz target assert:
    // if it let an unscoped place pass, both would pass vacuously.
    let owned = owned();
    let ours = vec![kv(LABEL, "team-a")];
    let good = request(&ours, &[], &ours);
    scoped(&good, &owned).unwrap();
    let number = KeyValue {
        key: LABEL.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(1)),
        }),
        ..Default::default()
    };
    let translated = kv("k8s.namespace.name", "team-a");
    let mut unscoped = vec![
        (
            "a resource without the label".to_string(),
            request(&[], &[], &ours),
        ),
        (
            "a resource with a foreign value".into(),
            request(&[kv(LABEL, "team-b")], &[], &ours),
        ),
        (
            "a resource with the label twice".into(),
            request(&[ours.clone(), ours.clone()].concat(), &[], &ours),
        ),
        (
            "a resource with a name that translates to the label".into(),
            request(
                &[ours.clone(), vec![translated.clone()]].concat(),
                &[],
                &ours,
            ),
        ),
        (
            "data points with a number for the value".into(),
            request(&ours, &[], &[number]),
        ),
        (
            "data points with a translated copy".into(),
            request(&ours, &[], &[ours.clone(), vec![translated]].concat()),
        ),
    ];
    let mut no_resource = good.clone();
    no_resource.resource_metrics[0].resource = None;
    unscoped.push((
        "a missing resource (the receiver's empty one)".into(),
        no_resource,
    ));
    // Each type's data points are read: one metric at a time without it.
    for (i, bare) in every_type(&[]).into_iter().enumerate() {
        let mut one = good.clone();
        let name = bare.name.clone();
        one.resource_metrics[0].scope_metrics[0].metrics[i] = bare;
        unscoped.push((format!("metric {name} without the label"), one));
    }
    for (what, request) in unscoped {
        assert!(scoped(&request, &owned).is_err(), "{what}");
    }
    // A scope attribute becomes `otel_scope_<name>`: it can make only a
    // label of that form, and then it must not be there at all.
    let label = "otel_scope_team";
    let ours = vec![kv(label, "team-a")];
    let with_scope = |scope: &[KeyValue]| request(&ours, scope, &ours);
    assert_eq!(check_scoped(&with_scope(&[]), label, &owned), Ok(()));
    assert!(check_scoped(&with_scope(&[kv("team", "team-a")]), label, &owned).is_err());
}

#[test]
fn the_nothing_else_changed_oracle_sees_all_but_the_label() {
    // It removes exactly what translates to the label, at each level...
    let came = request(
        &[kv("k8s.namespace.name", "team-b"), kv("service.name", "s")],
        &[kv("x", "y")],
        &[kv(LABEL, "team-b"), kv("job", "x")],
    );
    let stripped = without_label(came.clone(), LABEL);
    assert_eq!(
        stripped,
        request(
            &[kv("service.name", "s")],
            &[kv("x", "y")],
            &[kv("job", "x")]
        )
    );
    // ...and a missing resource is the receiver's empty one.
    let mut missing = came.clone();
    missing.resource_metrics[0].resource = None;
    let mut empty = came.clone();
    empty.resource_metrics[0].resource = Some(Resource::default());
    assert_eq!(without_label(missing, LABEL), without_label(empty, LABEL));
    // Anything else that differs, it shows: a bucket, a name.
    let mut lost = came.clone();
    let metric = &mut lost.resource_metrics[0].scope_metrics[0].metrics[2];
    let Some(Data::Histogram(h)) = &mut metric.data else {
        panic!("the third metric is the histogram")
    };
    h.data_points[0].bucket_counts[2] -= 1;
    assert_ne!(without_label(lost, LABEL), stripped);
    let mut renamed = came;
    renamed.resource_metrics[0].scope_metrics[0].metrics[0].name = "g2".into();
    assert_ne!(without_label(renamed, LABEL), stripped);
}

#[test]
fn a_foreign_value_is_refused_under_reject_naming_the_metric() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Reject);
    let mut r = request(&[], &[], &[kv("k8s.namespace.name", "team-b")]);
    let error = rewrite_decoded(&mut r, &t).unwrap_err();
    assert!(
        matches!(&error, OtlpError::ForeignLabel(ForeignLabel(m)) if m.contains("\"g\"")),
        "{error}"
    );
    let mut foreign_resource = request(&[kv(LABEL, "team-b")], &[], &[]);
    let error = rewrite_decoded(&mut foreign_resource, &t).unwrap_err();
    assert!(
        matches!(&error, OtlpError::ForeignLabel(ForeignLabel(m)) if m.contains("a resource")),
        "{error}"
    );
    // An owned copy beside a foreign one excuses nothing.
    let both = [kv(LABEL, "team-a"), kv("k8s.namespace.name", "team-b")];
    let mut mixed = request(&[], &[], &both);
    assert!(rewrite_decoded(&mut mixed, &t).is_err());
    let mut fine = request(&[kv(LABEL, "team-a")], &[], &[kv(LABEL, "team-a-2")]);
    assert!(rewrite_decoded(&mut fine, &t).is_ok());
}

#[test]
fn a_non_string_value_is_never_taken_for_an_owned_one() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let number = KeyValue {
        key: LABEL.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(7)),
        }),
        ..Default::default()
    };
    let mut r = request(&[], &[], &[number]);
    let stats = rewrite_decoded(&mut r, &t).unwrap();
    assert_eq!(stats.overwritten, 5);
    scoped(&r, &owned).unwrap();
}

fn headers(ct: &str, ce: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
    if let Some(ce) = ce {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_str(ce).unwrap());
    }
    h
}

#[test]
fn headers_protobuf_gzip_or_identity_json_refused() {
    assert_eq!(
        read_headers(&headers("application/x-protobuf", None)),
        Ok(Encoding::Identity)
    );
    assert_eq!(
        read_headers(&headers("Application/X-Protobuf", Some("GZIP"))),
        Ok(Encoding::Gzip)
    );
    assert_eq!(
        read_headers(&headers("application/x-protobuf", Some("identity"))),
        Ok(Encoding::Identity)
    );
    for (ct, ce) in [
        ("application/json", None),
        ("text/plain", None),
        ("application/x-protobuf", Some("snappy")),
        ("application/x-protobuf", Some("zstd")),
    ] {
        assert!(
            matches!(
                read_headers(&headers(ct, ce)),
                Err(OtlpError::Unsupported(_))
            ),
            "{ct} {ce:?}"
        );
    }
    let json = read_headers(&headers("application/json", None))
        .unwrap_err()
        .to_string();
    assert!(json.contains("OTLP/JSON"), "{json}");
    // The reason names what came, in words (it reaches the sender).
    let text = read_headers(&headers("text/plain", None))
        .unwrap_err()
        .to_string();
    assert!(text.contains("content type \"text/plain\""), "{text}");
    let none = read_headers(&HeaderMap::new()).unwrap_err().to_string();
    assert!(none.contains("no content type"), "{none}");
}

#[test]
fn a_repeated_type_or_coding_is_refused_whichever_copy_a_receiver_reads() {
    for (name, first, second) in [
        (header::CONTENT_ENCODING, "identity", "gzip"),
        (header::CONTENT_ENCODING, "gzip", "identity"),
        (
            header::CONTENT_TYPE,
            "application/x-protobuf",
            "application/json",
        ),
        (
            header::CONTENT_TYPE,
            "application/x-protobuf",
            "application/x-protobuf",
        ),
    ] {
        let mut h = headers("application/x-protobuf", None);
        h.insert(name.clone(), HeaderValue::from_static(first));
        h.append(name.clone(), HeaderValue::from_static(second));
        let refusal = read_headers(&h).unwrap_err();
        assert!(
            matches!(&refusal, OtlpError::Unsupported(why) if why.contains("more than one")),
            "{name}: {first}, {second}: {refusal}"
        );
    }
}

#[test]
fn upstream_headers_describe_the_body_as_it_leaves() {
    // Sent gzip, forwarded uncompressed (`otlp_forward_encoding: identity`):
    // a gzip label left on the body would make the receiver refuse it.
    let mut h = headers("Application/X-Protobuf", Some("GZIP"));
    set_upstream_headers(Encoding::Identity, &mut h);
    assert_eq!(h.get_all(header::CONTENT_TYPE).iter().count(), 1);
    assert_eq!(h[header::CONTENT_TYPE], "application/x-protobuf");
    assert!(h.get(header::CONTENT_ENCODING).is_none());
    assert_eq!(read_headers(&h), Ok(Encoding::Identity));
    // Sent uncompressed, forwarded gzip.
    let mut h = headers("application/x-protobuf", None);
    set_upstream_headers(Encoding::Gzip, &mut h);
    assert_eq!(h.get_all(header::CONTENT_ENCODING).iter().count(), 1);
    assert_eq!(h[header::CONTENT_ENCODING], "gzip");
    assert_eq!(read_headers(&h), Ok(Encoding::Gzip));
}

fn gzip(raw: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(raw).unwrap();
    gz.finish().unwrap()
}

/// What the receiver decodes from a forwarded body, in its encoding.
fn forwarded(
    encoding: Encoding,
    body: &[u8],
    t: &TenantLabel<'_>,
) -> Result<(ExportMetricsServiceRequest, Rewritten), OtlpError> {
    let (rewritten, _) = rewrite_body(encoding, encoding, body, t, 1 << 20)?;
    let sent = match &rewritten {
        Rewritten::Unchanged => body,
        Rewritten::Body(out) => out.as_slice(),
    };
    let mut plain = sent.to_vec();
    if encoding == Encoding::Gzip {
        plain.clear();
        MultiGzDecoder::new(sent).read_to_end(&mut plain).unwrap();
    }
    let request = ExportMetricsServiceRequest::decode(plain.as_slice()).expect("decodes");
    Ok((request, rewritten))
}

#[test]
fn bodies_round_trip_in_their_encoding_and_are_bounded() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let raw = request(&[], &[], &[kv("job", "x")]).encode_to_vec();
    for (encoding, body) in [
        (Encoding::Gzip, gzip(&raw)),
        (Encoding::Identity, raw.clone()),
    ] {
        let (sent, rewritten) = forwarded(encoding, &body, &t).unwrap();
        assert_ne!(rewritten, Rewritten::Unchanged);
        scoped(&sent, &owned).unwrap();
    }

    // A gzip bomb stops at the limit, before the whole of it is inflated.
    let bomb = gzip(&vec![0u8; 8 << 20]);
    assert_eq!(
        rewrite_body(Encoding::Gzip, Encoding::Gzip, &bomb, &t, 1 << 20),
        Err(OtlpError::TooLarge { limit: 1 << 20 })
    );
    assert_eq!(
        rewrite_body(Encoding::Identity, Encoding::Identity, &raw, &t, 16),
        Err(OtlpError::TooLarge { limit: 16 })
    );
    // The limit is the largest size accepted, not the first refused.
    let exactly = raw.len() as u64;
    for (encoding, body) in [
        (Encoding::Gzip, gzip(&raw)),
        (Encoding::Identity, raw.clone()),
    ] {
        assert!(rewrite_body(encoding, encoding, &body, &t, exactly).is_ok());
        assert_eq!(
            rewrite_body(encoding, encoding, &body, &t, exactly - 1),
            Err(OtlpError::TooLarge { limit: exactly - 1 })
        );
    }
    assert!(matches!(
        rewrite_body(Encoding::Gzip, Encoding::Gzip, &raw, &t, 1 << 20),
        Err(OtlpError::Malformed(_))
    ));
    assert!(matches!(
        rewrite_body(
            Encoding::Identity,
            Encoding::Identity,
            b"\xff\xff\xff",
            &t,
            1 << 20
        ),
        Err(OtlpError::Malformed(_))
    ));
}

#[test]
fn a_thread_keeps_buffers_of_a_usual_body_and_releases_an_unusually_large_ones() {
    // Each test runs on a thread of its own: the scratch buffers here are
    // this test's.
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let body_of = |value_bytes: usize| {
        gzip(&request(&[], &[], &[kv("big", &"x".repeat(value_bytes))]).encode_to_vec())
    };
    let capacities = || {
        SCRATCH.with(|s| {
            [
                s.borrow().decompressed.capacity(),
                s.borrow().rewritten.capacity(),
            ]
        })
    };
    let rewrite = |body: &[u8]| rewrite_body(Encoding::Gzip, Encoding::Gzip, body, &t, 64 << 20);
    assert!(rewrite(&body_of(100_000)).is_ok());
    assert!(
        capacities().iter().all(|c| *c >= 100_000),
        "{:?}",
        capacities()
    );
    // Every data point of `every_type` carries the 1 MiB value: over 4 MiB.
    assert!(rewrite(&body_of(1 << 20)).is_ok());
    assert_eq!(capacities(), [0, 0]);
}

#[test]
fn a_body_already_scoped_leaves_as_it_came() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Reject);
    let scoped_request = request(
        &[kv("service.name", "svc"), kv(LABEL, "team-a")],
        &[kv("x", "y")],
        &[kv("job", "x"), kv(LABEL, "team-a-2")],
    );
    let raw = scoped_request.encode_to_vec();
    for (encoding, body) in [
        (Encoding::Gzip, gzip(&raw)),
        (Encoding::Identity, raw.clone()),
    ] {
        let (sent, rewritten) = forwarded(encoding, &body, &t).unwrap();
        assert_eq!(rewritten, Rewritten::Unchanged, "{encoding:?}");
        assert_eq!(sent, scoped_request);
    }
}

#[test]
fn every_gzip_member_is_read_as_the_receiver_reads_them() {
    // Go's gzip reader (the receiver's) reads concatenated members as one
    // body: a second member must not carry an unchecked resource.
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let first = request(&[kv(LABEL, "team-a")], &[], &[kv(LABEL, "team-a")]);
    let second = request(&[kv(LABEL, "team-b")], &[], &[kv(LABEL, "team-b")]);
    let mut body = gzip(&first.encode_to_vec());
    body.extend(gzip(&second.encode_to_vec()));
    let (sent, rewritten) = forwarded(Encoding::Gzip, &body, &t).unwrap();
    assert_ne!(rewritten, Rewritten::Unchanged);
    assert_eq!(sent.resource_metrics.len(), 2);
    scoped(&sent, &owned).unwrap();
}

#[test]
fn fields_the_schema_does_not_know_are_not_forwarded() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    // Field 1000 of ResourceMetrics (the removed instrumentation library
    // metrics, which older collectors still read) and field 31 of the
    // request, each carrying "abc".
    let mut resource_metrics = ResourceMetrics::default().encode_to_vec();
    resource_metrics.extend_from_slice(&[0xc2, 0x3e, 0x03, b'a', b'b', b'c']);
    let mut raw = Vec::new();
    crate::enforce::protowire::write_len_field(&mut raw, 1, &resource_metrics);
    raw.extend_from_slice(&[0xfa, 0x01, 0x03, b'a', b'b', b'c']);
    let (out, stats) = rewrite(&raw, &t).unwrap();
    assert!(!out.windows(3).any(|w| w == b"abc"));
    assert_eq!(stats.dropped_fields, 2);
    scoped(
        &ExportMetricsServiceRequest::decode(out.as_slice()).unwrap(),
        &owned,
    )
    .unwrap();
}

#[test]
fn a_body_a_receiver_could_read_another_way_is_refused() {
    let owned = owned();
    let t = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let mut resource_metrics = Vec::new();
    let resource = |key: &str| {
        Resource {
            attributes: vec![kv(key, "team-b")],
            ..Default::default()
        }
        .encode_to_vec()
    };
    // Two resources: the receiver merges them into one.
    crate::enforce::protowire::write_len_field(&mut resource_metrics, 1, &resource("a"));
    crate::enforce::protowire::write_len_field(&mut resource_metrics, 1, &resource("b"));
    let mut two_resources = Vec::new();
    crate::enforce::protowire::write_len_field(&mut two_resources, 1, &resource_metrics);

    // An attribute named twice: the receiver takes the last name.
    let mut kv_bytes = kv("harmless", "team-b").encode_to_vec();
    crate::enforce::protowire::write_len_field(&mut kv_bytes, 1, LABEL.as_bytes());
    let mut resource_bytes = Vec::new();
    crate::enforce::protowire::write_len_field(&mut resource_bytes, 1, &kv_bytes);
    let mut resource_metrics = Vec::new();
    crate::enforce::protowire::write_len_field(&mut resource_metrics, 1, &resource_bytes);
    let mut renamed = Vec::new();
    crate::enforce::protowire::write_len_field(&mut renamed, 1, &resource_metrics);

    // A path field in another wire type, and two whose fixed-size payloads
    // would read as messages, were they taken for length-delimited:
    // field 1 of the request as fixed32 (a ResourceMetrics of two empty
    // schema URLs), and a resource attribute as fixed64 (`x` = "v").
    let wrong_type = vec![0x08, 0x01];
    let fixed32_resource_metrics = vec![0x0d, 0x1a, 0x00, 0x1a, 0x00];
    let resource = [0x09, 0x0a, 0x01, b'x', 0x12, 0x03, 0x0a, 0x01, b'v'];
    let mut resource_metrics = Vec::new();
    crate::enforce::protowire::write_len_field(&mut resource_metrics, 1, &resource);
    let mut fixed64_attribute = Vec::new();
    crate::enforce::protowire::write_len_field(&mut fixed64_attribute, 1, &resource_metrics);

    for body in [
        two_resources,
        renamed,
        wrong_type,
        fixed32_resource_metrics,
        fixed64_attribute,
    ] {
        assert!(
            matches!(rewrite(&body, &t), Err(OtlpError::Malformed(_))),
            "{body:?}"
        );
    }
}

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "k8s_namespace_name",
        "k8s.namespace.name",
        "k8s-namespace-name",
        "k8s..namespace.name",
        "job",
        "service.name",
        "namespace",
        "x",
    ])
    .prop_map(String::from)
}

fn attributes() -> impl Strategy<Value = Vec<KeyValue>> {
    let value = prop::sample::select(vec!["team-a", "team-a-2", "team-b", ""]);
    prop::collection::vec((key(), value), 0..5)
        .prop_map(|pairs| pairs.iter().map(|(k, v)| kv(k, v)).collect())
}

proptest! {
    /// Whatever attributes come in, at every level, what is forwarded
    /// decodes to a request in which the receiver can only find the
    /// tenant's label with an owned value (or the request is refused), and
    /// which is the request that came in all else.
    #[test]
    fn every_forwarded_request_is_scoped(
        resource in attributes(), scope in attributes(), points in attributes(),
        reject in any::<bool>(), gz in any::<bool>(),
    ) {
        let owned = owned();
        let policy = if reject { ForeignLabelPolicy::Reject } else { ForeignLabelPolicy::Overwrite };
        let came = request(&resource, &scope, &points);
        let raw = came.encode_to_vec();
        let (encoding, body) = if gz { (Encoding::Gzip, gzip(&raw)) } else { (Encoding::Identity, raw) };
        if let Ok((sent, _)) = forwarded(encoding, &body, &tenant(&owned, policy)) {
            prop_assert!(scoped(&sent, &owned).is_ok(), "{:?}", scoped(&sent, &owned));
            prop_assert_eq!(without_label(sent, LABEL), without_label(came, LABEL), "nothing else changed");
        } else {
            prop_assert!(reject, "only the reject policy refuses well-formed input");
        }
    }
}

/// The size a body says it inflates to: its own as identity; a gzip
/// member's trailer, the last one's if there are several (the rewrite's
/// own limit bounds what the trailer understates), none if too short.
#[test]
fn a_body_says_what_it_inflates_to_in_its_trailer() {
    let raw = vec![0u8; 3 << 20];
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &raw).unwrap();
    let member = gz.finish().unwrap();
    assert_eq!(
        Encoding::Identity.inflated_size_hint(&member, 10),
        member.len() as u64
    );
    assert_eq!(
        Encoding::Gzip.inflated_size_hint(&member, u64::MAX),
        3 << 20
    );
    assert_eq!(Encoding::Gzip.inflated_size_hint(&member, 5_000), 5_000);
    let mut small = GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut small, b"x").unwrap();
    let two = [member.as_slice(), &small.finish().unwrap()].concat();
    assert_eq!(Encoding::Gzip.inflated_size_hint(&two, u64::MAX), 1);
    assert_eq!(
        Encoding::Gzip.inflated_size_hint(&member[..17], u64::MAX),
        0
    );
}
