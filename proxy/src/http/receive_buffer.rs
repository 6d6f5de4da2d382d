//! A connection's kernel receive buffer, fixed by a setting (`SO_RCVBUF`).
//!
//! Unset, Linux sizes each socket's receive buffer by itself, growing it
//! with the pace the application reads at, up to `net.ipv4.tcp_rmem`'s
//! maximum (6 MiB by default). What arrives while the proxy does not read
//! waits there: a client's pipelined requests while their answers wait
//! (no credential needed), an upstream's answer whose client stopped
//! reading. A memory cgroup v2 charges it to the pod. A fixed size bounds
//! it (the kernel doubles what it is given, for its own overhead) and
//! bounds the connection's pace to about that much a round trip. Upstream
//! connections get it before they connect (`upstream/plain.rs`, and
//! hyper's connector), client connections from their listener
//! (`http/server.rs`, `bind`).

/// Warns when `setting` fixes a buffer above `net.core.rmem_max`: the
/// kernel takes that maximum instead, without a word. (Where the file
/// cannot be read, as in some network namespaces, nothing is said.)
pub fn warn_if_capped(setting: &'static str, bytes: u32) {
    let Ok(text) = std::fs::read_to_string("/proc/sys/net/core/rmem_max") else {
        return;
    };
    match text.trim().parse::<u32>() {
        Ok(max) if bytes > max => tracing::warn!(
            setting,
            bytes,
            rmem_max = max,
            "a fixed receive buffer is above net.core.rmem_max; \
             the kernel gives each connection rmem_max instead"
        ),
        _ => {}
    }
}
