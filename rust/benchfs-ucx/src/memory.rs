//! Memory registration: a buffer mapped for a worker's transports, unmapped on drop.

use std::ptr;

use benchfs_ucx_sys as sys;

use crate::*;

/// Memory registered with UCX (`ucp_mem_map`), so transfers from and to it skip the
/// registration cache. Unmapped on drop; keeps the context alive until then.
pub struct MemHandle {
    pub(crate) memh: sys::ucp_mem_h,
    pub(crate) worker: Worker,
}

impl Drop for MemHandle {
    fn drop(&mut self) {
        if self.worker.inner.forked_away() {
            return;
        }
        // SAFETY: mapped once in `mem_map` with this context; unmapped once.
        unsafe {
            sys::ucp_mem_unmap(self.worker.inner.context, self.memh);
        }
    }
}

impl Worker {
    /// Registers `len` bytes at `ptr` with UCX.
    ///
    /// # Safety
    /// The memory must stay allocated until the returned handle is dropped.
    pub unsafe fn mem_map(&self, ptr: *mut u8, len: usize) -> Result<MemHandle> {
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH) as u64,
            address: ptr.cast(),
            length: len,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        check(
            "mem_map",
            sys::ucp_mem_map(self.inner.context, &params, &mut memh),
        )?;
        Ok(MemHandle {
            memh,
            worker: self.clone(),
        })
    }
}
