//! Every default of the configuration file, in one place.

use std::time::Duration;

pub fn poll_interval() -> Duration {
    Duration::from_secs(5)
}
pub fn tenant_label() -> String {
    "namespace".into()
}
pub fn tenant_header() -> String {
    "X-Scope-OrgID".into()
}
pub fn query_cache_size() -> usize {
    10_000
}
pub fn max_body_bytes() -> u64 {
    16 * 1024 * 1024
}
pub fn max_decompressed_bytes() -> u64 {
    64 * 1024 * 1024
}
pub fn max_header_bytes() -> usize {
    64 * 1024
}
pub fn service_name() -> String {
    "tenant-proxy".into()
}
pub fn sample_ratio() -> f64 {
    1.0
}
pub fn export_interval() -> Duration {
    Duration::from_secs(5)
}
pub fn export_timeout() -> Duration {
    Duration::from_secs(10)
}
pub fn max_header_count() -> usize {
    100
}
pub fn max_connections() -> usize {
    4096
}
/// 200, hyper's own default: Go's servers take 250, nginx 128.
pub fn max_http2_streams() -> u32 {
    200
}
pub fn header_read_timeout() -> Duration {
    Duration::from_secs(30)
}
pub fn tls_reload_interval() -> Duration {
    Duration::from_secs(30)
}
pub fn body_read_timeout() -> Duration {
    Duration::from_secs(60)
}
pub fn upstream_timeout() -> Duration {
    Duration::from_secs(120)
}
/// Below the idle timeouts met in front of the upstreams: nginx's 75 s
/// (the gateways of the Loki and Mimir charts), a cloud balancer's 60 s
/// (AWS), Loki's and Mimir's own 120 s.
pub fn upstream_idle_timeout() -> Duration {
    Duration::from_secs(50)
}
pub fn shutdown_grace() -> Duration {
    Duration::from_secs(30)
}
pub fn cache_size() -> usize {
    10_000
}
pub fn max_concurrent_verifications() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}
/// 128 MiB: six verifications against hashes of the default parameters
/// (19 MiB each), or two against the largest accepted (64 MiB), within
/// a sixth of the manifests' 768 MiB memory limit.
pub fn verification_memory_bytes() -> u64 {
    128 << 20
}
pub fn verification_wait() -> Duration {
    Duration::from_secs(5)
}
/// 256: about three seconds of verifications on two cores (some 25 ms
/// each), within the five-second wait; 256 requests waiting hold at most
/// about 50 MiB (each its head, held twice over HTTP/2, an HTTP/2 stream's
/// 64 KiB of body and its state).
pub fn max_pending_verifications() -> usize {
    256
}
pub fn max_failures_per_user() -> u32 {
    10
}
pub fn max_failures_per_user_from_fresh_addresses() -> u32 {
    10
}
pub fn max_failures_per_client() -> u32 {
    30
}
pub fn failure_window() -> Duration {
    Duration::from_secs(60)
}
