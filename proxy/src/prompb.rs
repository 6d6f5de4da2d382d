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
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(double, tag = "1")]
        pub value: f64,
        #[prost(int64, tag = "2")]
        pub timestamp: i64,
    }
}
