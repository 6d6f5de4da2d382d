//! A real Prometheus (Debian's package, 2.42) started on a free loopback
//! port with a temporary data directory, fed through its remote-write
//! receiver, and stopped by its PID when dropped.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, StatusCode};
use prost::Message;
use tenant_proxy::enforce::prompb::{Label, Sample, TimeSeries, WriteRequest};

pub struct PrometheusProcess {
    pub addr: SocketAddr,
    args: Vec<String>,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Drop for PrometheusProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

impl PrometheusProcess {
    /// A receiver: `rules` is the content of a rule file evaluated every second.
    pub async fn start(rules: &str) -> Self {
        let rules = rules.to_owned();
        Self::spawn(
            move |dir, _| {
                std::fs::write(dir.join("rules.yml"), &rules).unwrap();
                "global:\n  scrape_interval: 1h\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n"
                    .to_owned()
            },
            &["--web.enable-remote-write-receiver", "--storage.tsdb.path=data"],
        )
        .await
    }

    /// An agent (`--enable-feature=agent`): a real remote-write client.
    /// `config` gets the agent's own address (for scraping itself).
    pub async fn start_agent(config: impl FnOnce(SocketAddr) -> String) -> Self {
        Self::spawn(
            move |_, addr| config(addr),
            // On SIGTERM an agent flushes its queue for up to this long.
            &[
                "--enable-feature=agent",
                "--storage.agent.path=agent-data",
                "--storage.remote.flush-deadline=1s",
            ],
        )
        .await
    }

    async fn spawn(
        config: impl FnOnce(&std::path::Path, SocketAddr) -> String,
        args: &[&str],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // A free port: bound, released, handed to Prometheus.
        let addr = super::closed_port().await;
        std::fs::write(dir.path().join("prometheus.yml"), config(dir.path(), addr)).unwrap();
        let mut all = vec![
            "--config.file=prometheus.yml".to_owned(),
            format!("--web.listen-address={addr}"),
            "--log.level=warn".to_owned(),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        let mut process = Self {
            addr,
            args: all,
            child: None,
            dir,
        };
        process.restart().await;
        process
    }

    /// Stops the process by its PID and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// Starts it (again) with the same port, flags and data directory.
    pub async fn restart(&mut self) {
        self.stop();
        let child = Command::new("prometheus")
            .args(&self.args)
            .current_dir(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the prometheus binary (Debian package `prometheus`; .ci/run installs it)");
        self.child = Some(child);
        self.wait_ready().await;
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Polls `/-/ready`: an external process gives no other signal.
    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::Empty<Bytes>>();
            let uri = format!("{}/-/ready", self.url()).parse().unwrap();
            if let Ok(response) = client.get(uri).await {
                if response.status() == StatusCode::OK {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "prometheus did not become ready in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Writes one sample per series, now, straight into Prometheus.
    pub async fn write(&self, series: &[(&[(&str, &str)], f64)]) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let request = WriteRequest {
            timeseries: series
                .iter()
                .map(|(labels, value)| time_series(labels, *value, now))
                .collect(),
            metadata: Vec::new(),
        };
        let body = snap::raw::Encoder::new()
            .compress_vec(&request.encode_to_vec())
            .unwrap();
        let reply = super::send(
            Method::POST,
            &format!("{}/api/v1/write", self.url()),
            None,
            &[
                ("content-type", "application/x-protobuf"),
                ("content-encoding", "snappy"),
                ("x-prometheus-remote-write-version", "0.1.0"),
            ],
            body,
        )
        .await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    }
}

pub fn time_series(labels: &[(&str, &str)], value: f64, timestamp: i64) -> TimeSeries {
    let mut labels: Vec<Label> = labels
        .iter()
        .map(|(name, value)| Label {
            name: (*name).into(),
            value: (*value).into(),
        })
        .collect();
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    TimeSeries {
        labels,
        samples: vec![Sample { value, timestamp }],
        exemplars: Vec::new(),
        histograms: Vec::new(),
    }
}

/// The `namespace` of every series in a query result or a series list
/// (the `data` of a Prometheus answer).
pub fn namespaces(data: &serde_json::Value) -> std::collections::BTreeSet<String> {
    let items = data
        .get("result")
        .unwrap_or(data)
        .as_array()
        .unwrap()
        .clone();
    items
        .iter()
        .map(|item| {
            item.get("metric").unwrap_or(item)["namespace"]
                .as_str()
                .unwrap_or("<none>")
                .to_owned()
        })
        .collect()
}
