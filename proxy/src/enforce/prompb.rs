//! Prometheus remote-write 1.0 messages (`prometheus.WriteRequest`, from
//! prometheus/prometheus `prompb/remote.proto` and `types.proto`),
//! hand-written for prost so no `protoc` is needed.
//!
//! prost drops fields a message does not declare, so everything the proxy
//! does not need to look at (exemplars, native histograms, metadata) is
//! declared as opaque bytes: re-encoding keeps it byte for byte.

#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    /// `MetricMetadata`, kept verbatim.
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub metadata: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    /// Sorted by name, names unique (the spec's rule, checked by receivers).
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    /// `Exemplar`, kept verbatim.
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub exemplars: Vec<Vec<u8>>,
    /// `Histogram` (native histograms), kept verbatim.
    #[prost(bytes = "vec", repeated, tag = "4")]
    pub histograms: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// Remote-write 2.0 messages (`io.prometheus.write.v2.Request`, from
/// prometheus/prometheus `prompb/io/prometheus/write/v2/types.proto`).
/// Labels are pairs of references into `symbols`; `symbols[0]` is `""`.
pub mod v2 {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(string, repeated, tag = "4")]
        pub symbols: Vec<String>,
        #[prost(message, repeated, tag = "5")]
        pub timeseries: Vec<TimeSeries>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TimeSeries {
        #[prost(uint32, repeated, tag = "1")]
        pub labels_refs: Vec<u32>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
        /// `Histogram`, kept verbatim.
        #[prost(bytes = "vec", repeated, tag = "3")]
        pub histograms: Vec<Vec<u8>>,
        /// `Exemplar` (labels are references too), kept verbatim.
        #[prost(bytes = "vec", repeated, tag = "4")]
        pub exemplars: Vec<Vec<u8>>,
        /// `Metadata`, kept verbatim.
        #[prost(bytes = "vec", optional, tag = "5")]
        pub metadata: Option<Vec<u8>>,
        #[prost(int64, tag = "6")]
        pub created_timestamp: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(double, tag = "1")]
        pub value: f64,
        #[prost(int64, tag = "2")]
        pub timestamp: i64,
    }

    impl Request {
        /// The labels and samples of a 1.0 request as 2.0, as Prometheus
        /// 3's sender builds one: every distinct string once in `symbols`,
        /// `""` first. Exemplars and histograms are left out (their 2.0
        /// form differs). For benches and load tests.
        pub fn from_v1(request: &super::WriteRequest) -> Self {
            let mut symbols = vec![String::new()];
            let mut index = std::collections::HashMap::new();
            let mut reference = |text: &str| -> u32 {
                *index.entry(text.to_owned()).or_insert_with(|| {
                    symbols.push(text.to_owned());
                    symbols.len() as u32 - 1
                })
            };
            let timeseries = request
                .timeseries
                .iter()
                .map(|series| TimeSeries {
                    labels_refs: series
                        .labels
                        .iter()
                        .flat_map(|l| [reference(&l.name), reference(&l.value)])
                        .collect(),
                    samples: series
                        .samples
                        .iter()
                        .map(|s| Sample {
                            value: s.value,
                            timestamp: s.timestamp,
                        })
                        .collect(),
                    ..TimeSeries::default()
                })
                .collect();
            Self {
                symbols,
                timeseries,
            }
        }
    }
}

/// How a receiver reads a decompressed remote-write body, under either
/// schema: the label sets it would store. Used by the tests and fuzz
/// targets that prove a forwarded body means the same to every receiver.
///
/// Names, values and symbols are decoded as bytes, not strings: Go's gogo
/// decoders (Prometheus, Mimir) do not check UTF-8, so a reading that
/// refused invalid UTF-8 would miss series a real receiver stores.
pub mod readings {
    /// A series as a receiver sees it: its labels in wire order.
    pub type LabelSet = Vec<(Vec<u8>, Vec<u8>)>;

    #[derive(Clone, PartialEq, prost::Message)]
    struct V1Request {
        #[prost(message, repeated, tag = "1")]
        timeseries: Vec<V1Series>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct V1Series {
        #[prost(message, repeated, tag = "1")]
        labels: Vec<V1Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct V1Label {
        #[prost(bytes = "vec", tag = "1")]
        name: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        value: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct V2Request {
        #[prost(bytes = "vec", repeated, tag = "4")]
        symbols: Vec<Vec<u8>>,
        #[prost(message, repeated, tag = "5")]
        timeseries: Vec<V2Series>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct V2Series {
        #[prost(uint32, repeated, tag = "1")]
        labels_refs: Vec<u32>,
    }

    /// The series a 1.0 receiver finds, or `None` where its decoder fails
    /// (then it stores nothing).
    pub fn as_v1(body: &[u8]) -> Option<Vec<LabelSet>> {
        let request = <V1Request as prost::Message>::decode(body).ok()?;
        Some(
            request
                .timeseries
                .into_iter()
                .map(|s| s.labels.into_iter().map(|l| (l.name, l.value)).collect())
                .collect(),
        )
    }

    /// The series a 2.0 receiver finds, or `None` where it stores nothing
    /// (its decoder fails, or a reference points outside the symbols).
    pub fn as_v2(body: &[u8]) -> Option<Vec<LabelSet>> {
        let request = <V2Request as prost::Message>::decode(body).ok()?;
        let symbol = |r: &u32| request.symbols.get(*r as usize).cloned();
        request
            .timeseries
            .iter()
            .map(|s| {
                s.labels_refs
                    .chunks(2)
                    .map(|pair| Some((symbol(&pair[0])?, symbol(pair.get(1)?)?)))
                    .collect()
            })
            .collect()
    }

    /// Whether every series of every reading carries exactly one `label`
    /// with a value in `owned`: the property remote write in label mode
    /// keeps for each body it forwards.
    pub fn only_owned_series(body: &[u8], label: &str, owned: &[String]) -> Result<(), String> {
        for (reading, series) in [("1.0", as_v1(body)), ("2.0", as_v2(body))] {
            for labels in series.into_iter().flatten() {
                let values: Vec<&[u8]> = labels
                    .iter()
                    .filter(|(n, _)| n == label.as_bytes())
                    .map(|(_, v)| v.as_slice())
                    .collect();
                if !matches!(values[..], [v] if owned.iter().any(|o| o.as_bytes() == v)) {
                    let pairs = labels.iter().map(|(n, v)| (n.as_slice(), v.as_slice()));
                    return Err(format!("read as {reading}: series {}", describe(pairs)));
                }
            }
        }
        Ok(())
    }

    /// A label set as text, `{name="value", ...}`, for error messages.
    pub fn describe<'a>(pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> String {
        let inner: Vec<String> = pairs
            .map(|(n, v)| {
                format!(
                    "{}={:?}",
                    String::from_utf8_lossy(n),
                    String::from_utf8_lossy(v)
                )
            })
            .collect();
        format!("{{{}}}", inner.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::readings::only_owned_series;
    use super::{v2, Label, TimeSeries, WriteRequest};
    use prost::Message;

    fn v1_body(labels: &[(&str, &str)]) -> Vec<u8> {
        let labels = labels
            .iter()
            .map(|(name, value)| Label {
                name: (*name).into(),
                value: (*value).into(),
            })
            .collect();
        WriteRequest {
            timeseries: vec![TimeSeries {
                labels,
                ..TimeSeries::default()
            }],
            metadata: Vec::new(),
        }
        .encode_to_vec()
    }

    /// `up{namespace=value}` as 2.0 writes it: references into the symbols.
    fn v2_body(value: &str) -> Vec<u8> {
        v2::Request {
            symbols: ["", "__name__", "up", "namespace", value]
                .map(String::from)
                .to_vec(),
            timeseries: vec![v2::TimeSeries {
                labels_refs: vec![1, 2, 3, 4],
                ..v2::TimeSeries::default()
            }],
        }
        .encode_to_vec()
    }

    /// The oracle the remote-write tests and fuzz target rest on can fail:
    /// a series with a foreign value, none, or two, under either reading.
    #[test]
    fn the_oracle_refuses_every_series_not_carrying_one_owned_value() {
        let owned = ["team-a".to_owned()];
        let check = |body: &[u8]| only_owned_series(body, "namespace", &owned);
        assert_eq!(
            check(&v1_body(&[("__name__", "up"), ("namespace", "team-a")])),
            Ok(())
        );
        assert_eq!(check(&v2_body("team-a")), Ok(()));
        let refused = [
            (
                v1_body(&[("namespace", "team-b")]),
                "read as 1.0: series {namespace=\"team-b\"}",
            ),
            (
                v1_body(&[("__name__", "up")]),
                "read as 1.0: series {__name__=\"up\"}",
            ),
            (
                v1_body(&[("namespace", "team-a"), ("namespace", "team-a")]),
                "read as 1.0: series {namespace=\"team-a\", namespace=\"team-a\"}",
            ),
            (
                v2_body("team-b"),
                "read as 2.0: series {__name__=\"up\", namespace=\"team-b\"}",
            ),
        ];
        for (body, why) in refused {
            assert_eq!(check(&body), Err(why.to_owned()));
        }
    }
}
