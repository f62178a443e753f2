//! Servers and a client in one process, over real UCX and io_uring.

use std::path::Path;

use benchfs_core::client::Client;
use benchfs_core::config::Config;
use benchfs_core::server::{ServerHandle, ServerOptions};
use benchfs_core::{Error, Result};

fn config(servers: u32, chunk: u64) -> Result<Config> {
    let mut c = Config::default();
    c.cluster.expected_servers = servers;
    c.cluster.connect_timeout_s = 10.0;
    c.client.chunk_size = chunk;
    c.client.request_timeout_s = 10.0;
    c.storage.buffer_count = 8;
    c.validate()?;
    Ok(c)
}

fn start(dir: &Path, n: u32, c: &Config) -> Result<Vec<ServerHandle>> {
    (0..n)
        .map(|id| {
            ServerHandle::spawn(ServerOptions {
                id,
                node: format!("node-{id}"),
                data_dir: dir.join(format!("data-{id}")),
                registry_dir: dir.join("registry"),
                config: c.clone(),
            })
        })
        .collect()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn write_read_verify_across_chunks_and_servers() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let c = config(3, 64 * 1024)?;
    let mut servers = start(dir.path(), 3, &c)?;
    let client = Client::connect(&dir.path().join("registry"), c.clone())?;
    assert_eq!(
        client.membership().iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );

    // Unaligned offset, many chunks, eager and rendezvous sizes.
    for (i, (offset, len)) in [
        (0u64, 100usize),
        (12_345, 1_000_000),
        (65_536, 65_536),
        (7, 3 << 20),
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!("/f{i}");
        let data = pattern(i as u64, len);
        assert_eq!(client.write(&path, offset, &data)?, len);
        let mut back = vec![0xAAu8; len];
        assert_eq!(client.read_into(&path, offset, &mut back)?, len);
        assert!(back == data, "data mismatch in {path}");
        assert_eq!(client.file_size(&path)?, offset + len as u64);
        // The hole before `offset` reads as zeros; reading past the end is short.
        if offset > 0 {
            let mut hole = vec![1u8; offset as usize];
            assert_eq!(client.read_into(&path, 0, &mut hole)?, offset as usize);
            assert!(hole.iter().all(|&b| b == 0));
        }
        let mut tail = vec![0u8; 1000];
        assert_eq!(client.read_into(&path, offset + len as u64 - 10, &mut tail)?, 10);
        assert_eq!(&tail[..10], &data[len - 10..]);
        assert_eq!(client.read_into(&path, offset + len as u64 + 5, &mut tail)?, 0);
    }
    // Zero-length operations.
    assert_eq!(client.write("/f0", 5, &[])?, 0);
    assert_eq!(client.read_into("/f0", 5, &mut [])?, 0);
    drop(client);
    for s in &mut servers {
        s.stop()?;
    }
    assert!(std::fs::read_dir(dir.path().join("registry"))
        .map_err(|e| Error::io("ls", e))?
        .next()
        .is_none());
    Ok(())
}

#[test]
fn missing_servers_are_named() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let mut c = config(3, 64 * 1024)?;
    let _servers = start(dir.path(), 2, &c)?;
    c.cluster.connect_timeout_s = 0.3;
    match Client::connect(&dir.path().join("registry"), c) {
        Err(Error::MissingServers { found, missing, .. }) => {
            assert_eq!(found, vec![0, 1]);
            assert_eq!(missing, vec![2]);
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("connected with a missing server"),
    }
    Ok(())
}
