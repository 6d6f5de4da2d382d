//! What tenant-sync's admin listener reports (served by tenant-proxy's admin
//! module): ready once the file matches a complete initial list.

use std::sync::Arc;

use tenant_proxy::ops::admin::AdminState;

use crate::controller::Status;
use crate::metrics::Metrics;

pub struct SyncAdmin {
    pub metrics: Arc<Metrics>,
    pub status: Arc<Status>,
}

impl AdminState for SyncAdmin {
    fn metrics(&self) -> String {
        self.metrics.encode()
    }

    fn readiness(&self) -> Result<(), &'static str> {
        if self.status.is_ready() {
            Ok(())
        } else {
            Err("initial sync not complete")
        }
    }
}
