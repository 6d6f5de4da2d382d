//! tenant-sync: keeps tenant-proxy's tenants file current from Kubernetes
//! Namespaces and `kubernetes.io/basic-auth` Secrets.
//!
//! `index` is the pure picture fed by watch events; `hashes` turns plaintext
//! passwords into argon2id once; `render` produces the file; `writer`
//! replaces it atomically; `controller` runs the loop; `admin` reports;
//! `notices` tells a skipped Secret's author why, with a Kubernetes Event.

pub mod admin;
pub mod controller;
pub mod hashes;
pub mod index;
pub mod metrics;
pub mod notices;
pub mod render;
pub mod writer;
