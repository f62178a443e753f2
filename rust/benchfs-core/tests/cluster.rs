//! Servers and a client in one process, over real UCX and io_uring.

use std::path::Path;

use benchfs_core::client::Client;
use benchfs_core::config::Config;
use benchfs_core::namespace::Kind;
use benchfs_core::protocol::meta::{CREATE, EXCLUSIVE, NO_REPLACE, TRUNCATE};
use benchfs_core::server::{ServerHandle, ServerOptions};
use benchfs_core::{Error, Result};

fn config(servers: u32, chunk: u64) -> Result<Config> {
    let mut c = Config::default();
    c.cluster.expected_servers = servers;
    c.cluster.connect_timeout_s = 10.0;
    c.layout.chunk_size = chunk;
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
                domain: String::new(),
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
        let f = client.open(&path, CREATE | EXCLUSIVE, 0o644)?;
        assert_eq!(client.write(&f, offset, &data)?, len);
        client.close(&f)?;
        let f = client.open(&path, 0, 0)?;
        assert_eq!(f.size(), offset + len as u64);
        let mut back = vec![0xAAu8; len];
        assert_eq!(client.read(&f, offset, &mut back)?, len);
        assert!(
            back == data,
            "data mismatch in {path}: {:?} vs {:?}",
            &back[..8],
            &data[..8]
        );
        assert_eq!(client.stat(&path)?.size, offset + len as u64);
        // The hole before `offset` reads as zeros; reading past the end is short.
        if offset > 0 {
            let mut hole = vec![1u8; offset as usize];
            assert_eq!(client.read(&f, 0, &mut hole)?, offset as usize);
            assert!(hole.iter().all(|&b| b == 0));
        }
        let mut tail = vec![0u8; 1000];
        assert_eq!(client.read(&f, offset + len as u64 - 10, &mut tail)?, 10);
        assert_eq!(&tail[..10], &data[len - 10..]);
        assert_eq!(client.read(&f, offset + len as u64 + 5, &mut tail)?, 0);
    }
    // Zero-length operations.
    let f = client.open("/f0", 0, 0)?;
    assert_eq!(client.write(&f, 5, &[])?, 0);
    assert_eq!(client.read(&f, 5, &mut [])?, 0);
    drop(client);
    for s in &mut servers {
        s.stop()?;
    }
    // Entries are gone; the job secret stays for the job's lifetime.
    assert!(benchfs_core::registry::scan(&dir.path().join("registry"))?.is_empty());
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

#[test]
fn malformed_requests_get_error_replies_and_the_server_keeps_serving() -> Result<()> {
    use benchfs_core::protocol::{Header, Op, AM_REPLY, AM_REQUEST};
    use benchfs_ucx::{AmVerdict, Worker};
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let c = config(1, 64 * 1024)?;
    let mut servers = start(dir.path(), 1, &c)?;
    let entry = benchfs_core::registry::scan(&dir.path().join("registry"))?.remove(0);

    let worker = Worker::new()?;
    let replies: Rc<RefCell<Vec<Header>>> = Rc::default();
    let sink = replies.clone();
    worker.set_am_handler(AM_REPLY, move |msg| {
        if let Ok(h) = Header::decode(msg.header) {
            sink.borrow_mut().push(h);
        }
        AmVerdict::Done
    })?;
    let ep = worker.connect(&entry.addresses()?[0], true)?;
    let token = benchfs_core::registry::job_token(&benchfs_core::registry::load_secret(
        &dir.path().join("registry"),
    )?);
    // Hello first: the server answers on the connection it opens back to this worker.
    let address = worker.address()?;
    let hello = Header::request(Op::Hello, 1, 0, 0, 0, address.len() as u64).encode();
    // SAFETY: `hello` and `address` outlive the loop that waits for the reply.
    let hello_sent = unsafe { ep.send_am(AM_REQUEST, &hello, &address, None) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while replies.borrow().is_empty() && Instant::now() < deadline {
        worker.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    let conn = replies.borrow_mut().pop().map(|h| h.offset as u32);
    assert!(hello_sent.is_done());
    let conn = conn.ok_or_else(|| Error::Protocol("no answer to hello".into()))?;
    assert!(conn > 0);
    let good = Header::request(Op::WriteChunk, 1, 42, 0, 0, 4)
        .with_token(token)
        .on_connection(conn);
    let mut bad_version = good.encode();
    bad_version[4] = (benchfs_core::protocol::VERSION + 1) as u8; // a version nobody speaks
    bad_version[16] = 77;
    let mut bad_op = good.encode();
    bad_op[6] = 99;
    bad_op[16] = 78;
    let short = Header {
        request_id: 79,
        ..good
    }
    .encode();
    let past_chunk = Header::request(Op::ReadChunk, 80, 42, 0, 60 * 1024, 8 * 1024)
        .with_token(token)
        .on_connection(conn)
        .encode();
    let no_token = Header::request(Op::ReadChunk, 81, 42, 0, 0, 8)
        .on_connection(conn)
        .encode();
    let wrong_token = Header::request(Op::ReadChunk, 82, 42, 0, 0, 8)
        .with_token(token ^ 2)
        .on_connection(conn)
        .encode();
    // A request on a connection the server never opened cannot be answered: only counted.
    let stranger = Header::request(Op::ReadChunk, 83, 42, 0, 0, 8)
        .with_token(token)
        .on_connection(conn + 1000)
        .encode();
    let cases: Vec<(Vec<u8>, &[u8])> = vec![
        (good.encode()[..10].to_vec(), &[]), // too short to carry an id: no reply
        (bad_version.to_vec(), &[]),
        (bad_op.to_vec(), &[]),
        (short.to_vec(), b"ab"), // header says 4 bytes, 2 arrive
        (past_chunk.to_vec(), &[]),
        (no_token.to_vec(), &[]),
        (wrong_token.to_vec(), &[]),
        (stranger.to_vec(), &[]),
    ];
    let mut sends = Vec::new();
    for (header, payload) in &cases {
        // SAFETY: `cases` outlives the progress loop below, which waits for every send.
        sends.push(unsafe { ep.send_am(AM_REQUEST, header, payload, None) });
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while replies.borrow().len() < 6 && Instant::now() < deadline {
        worker.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    while !sends.iter().all(|s| s.is_done()) && Instant::now() < deadline {
        worker.progress();
    }
    let mut got: Vec<(u64, i32)> = replies
        .borrow()
        .iter()
        .map(|h| (h.request_id, h.status))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (77, -libc::EPROTO),
            (78, -libc::EPROTO),
            (79, -libc::EINVAL),
            (80, -libc::EINVAL),
            (81, -libc::EACCES),
            (82, -libc::EACCES),
        ]
    );
    drop(ep);
    drop(worker);

    // The server still serves well-formed requests.
    let client = Client::connect(&dir.path().join("registry"), c)?;
    let f = client.open("/after", CREATE, 0o644)?;
    assert_eq!(client.write(&f, 0, b"still fine")?, 10);
    let mut back = [0u8; 10];
    assert_eq!(client.read(&f, 0, &mut back)?, 10);
    assert_eq!(&back, b"still fine");
    drop(client);
    let stats = servers[0].stop()?;
    assert_eq!(stats.map(|s| (s.malformed, s.refused_auth)), Some((5, 2)));
    Ok(())
}

#[test]
fn servers_with_several_workers_serve_every_chunk() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let mut c = config(2, 64 * 1024)?;
    c.server.workers = 3;
    let mut servers = start(dir.path(), 2, &c)?;
    assert!(servers.iter().all(|s| s.entry.ucx_addresses.len() == 3));
    let client = Client::connect(&dir.path().join("registry"), c)?;
    let data = pattern(9, 3 << 20);
    let f = client.open("/wide", CREATE, 0o644)?;
    assert_eq!(client.write(&f, 1234, &data)?, data.len());
    let mut back = vec![0u8; data.len()];
    assert_eq!(client.read(&f, 1234, &mut back)?, data.len());
    assert!(back == data);
    client.fsync(&f)?;
    assert_eq!(client.stat("/wide")?.size, 1234 + data.len() as u64);
    drop(client);
    let mut requests = 0;
    for s in &mut servers {
        requests += s.stop()?.map_or(0, |st| st.requests);
    }
    // 49 chunk writes + 49 reads + fsync on the 6 workers + metadata.
    assert!(requests >= 98 + 6, "only {requests} requests");
    Ok(())
}

/// Chunk files under every server's data directory (for checking that data is freed).
fn chunk_files(dir: &Path) -> usize {
    fn walk(p: &Path) -> usize {
        std::fs::read_dir(p).map_or(0, |rd| {
            rd.flatten()
                .map(|e| {
                    let path = e.path();
                    if path.is_dir() {
                        walk(&path)
                    } else {
                        1
                    }
                })
                .sum()
        })
    }
    (0..8).map(|i| walk(&dir.join(format!("data-{i}/chunks")))).sum()
}

#[test]
fn namespace_operations_across_owners() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let c = config(3, 4096)?;
    let mut servers = start(dir.path(), 3, &c)?;
    let client = Client::connect(&dir.path().join("registry"), c)?;
    let errno = |r: Result<()>| r.err().map(|e| e.errno());
    client.mkdir("/d", 0o755)?;
    assert_eq!(errno(client.mkdir("/d", 0o755)), Some(libc::EEXIST));
    assert_eq!(errno(client.mkdir("/nope/x", 0o755)), Some(libc::ENOENT));
    for i in 0..20 {
        let f = client.open(&format!("/d/f{i:02}"), CREATE | EXCLUSIVE, 0o600)?;
        client.write(&f, 0, &pattern(i, 10_000))?;
        client.close(&f)?;
    }
    assert_eq!(chunk_files(dir.path()), 20 * 3);
    let names: Vec<String> = client.readdir("/d")?.into_iter().map(|e| e.name).collect();
    assert_eq!(names, (0..20).map(|i| format!("f{i:02}")).collect::<Vec<_>>());
    assert_eq!(
        client
            .open("/d/f00", CREATE | EXCLUSIVE, 0)
            .err()
            .map(|e| e.errno()),
        Some(libc::EEXIST)
    );
    assert_eq!(
        client.open("/d/f00/x", CREATE, 0).err().map(|e| e.errno()),
        Some(libc::ENOTDIR)
    );
    assert_eq!(
        client.open("/d", CREATE, 0).err().map(|e| e.errno()),
        Some(libc::EISDIR)
    );
    assert_eq!(errno(client.rmdir("/d")), Some(libc::ENOTEMPTY));
    // Rename keeps the id (data does not move), replacing a file frees the replaced data.
    let id = client.stat("/d/f00")?.id;
    client.rename("/d/f00", "/d/f01")?;
    assert_eq!(client.stat("/d/f01")?.id, id);
    assert_eq!(client.stat("/d/f00").err().map(|e| e.errno()), Some(libc::ENOENT));
    assert_eq!(chunk_files(dir.path()), 19 * 3);
    let f = client.open("/d/f01", 0, 0)?;
    let mut back = vec![0u8; 10_000];
    assert_eq!(client.read(&f, 0, &mut back)?, 10_000);
    assert!(back == pattern(0, 10_000));
    // Truncate frees whole chunks beyond the size and zeroes the cut chunk's tail.
    client.truncate("/d/f01", 5000)?;
    assert_eq!(chunk_files(dir.path()), 19 * 3 - 1);
    client.truncate("/d/f01", 10_000)?;
    let f = client.open("/d/f01", 0, 0)?;
    assert_eq!(client.read(&f, 0, &mut back)?, 10_000);
    assert!(back[..5000] == pattern(0, 10_000)[..5000] && back[5000..].iter().all(|&b| b == 0));
    // O_TRUNC frees the data too; unlink frees everything.
    let f = client.open("/d/f02", CREATE | TRUNCATE, 0)?;
    assert_eq!(f.size(), 0);
    assert_eq!(chunk_files(dir.path()), 18 * 3 - 1);
    for i in 1..20 {
        client.unlink(&format!("/d/f{i:02}"))?;
    }
    assert_eq!(chunk_files(dir.path()), 0);
    assert!(client.readdir("/d")?.is_empty());
    client.rmdir("/d")?;
    assert_eq!(client.readdir("/")?.len(), 0);
    // Directory rename: empty works, non-empty is EXDEV.
    client.mkdir("/a", 0o755)?;
    client.mkdir("/a/b", 0o755)?;
    assert_eq!(errno(client.rename("/a", "/c")), Some(libc::EXDEV));
    assert_eq!(errno(client.rename("/a", "/a/b/c")), Some(libc::EINVAL));
    client.rename("/a/b", "/b")?;
    assert_eq!(client.stat("/b")?.kind, Kind::Dir);
    assert_eq!(
        client
            .readdir("/")?
            .into_iter()
            .map(|e| e.name)
            .collect::<Vec<_>>(),
        vec!["a", "b"]
    );
    // NO_REPLACE: an existing target is EEXIST and both names stay as they were.
    let f = client.open("/a/x", CREATE, 0o644)?;
    client.write(&f, 0, b"x")?;
    client.close(&f)?;
    let g = client.open("/y", CREATE, 0o644)?;
    client.close(&g)?;
    assert_eq!(
        errno(client.rename_with("/a/x", "/y", NO_REPLACE)),
        Some(libc::EEXIST)
    );
    assert_eq!((client.stat("/a/x")?.size, client.stat("/y")?.size), (1, 0));
    client.rename_with("/a/x", "/z", NO_REPLACE)?;
    assert_eq!(client.stat("/z")?.size, 1);
    assert_eq!(errno(client.stat("/a/x").map(drop)), Some(libc::ENOENT));
    client.unlink("/y")?;
    client.unlink("/z")?;
    // Bad paths are POSIX errors and change nothing.
    for (path, e) in [
        ("", libc::ENOENT),
        ("rel", libc::EINVAL),
        ("/..", libc::EINVAL),
        ("/a\0b", libc::EINVAL),
    ] {
        assert_eq!(client.stat(path).err().map(|x| x.errno()), Some(e), "{path:?}");
    }
    let long = format!("/{}", "n".repeat(300));
    assert_eq!(
        client.open(&long, CREATE, 0).err().map(|x| x.errno()),
        Some(libc::ENAMETOOLONG)
    );
    drop(client);
    for s in &mut servers {
        s.stop()?;
    }
    Ok(())
}

/// One shared client and one shared file, used by four threads at once (each its own range,
/// several passes): every byte comes back, and a closed client or file is an error, not a crash.
#[test]
fn threads_take_turns_on_a_shared_client_and_file() -> Result<()> {
    use benchfs_core::shared::{SharedClient, SharedFile};
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let c = config(2, 64 * 1024)?;
    let mut servers = start(dir.path(), 2, &c)?;
    let client = SharedClient::new(Client::connect(&dir.path().join("registry"), c)?);
    let file = SharedFile::new(client.with(|cl| cl.open("/shared", CREATE | EXCLUSIVE, 0o644))?);
    const PIECE: usize = 200_000;
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let (client, file) = (&client, &file);
                s.spawn(move || -> Result<()> {
                    for pass in 0..5u64 {
                        let data = pattern(t * 100 + pass, PIECE);
                        let at = t * PIECE as u64;
                        assert_eq!(file.with(client, |cl, f| cl.write(f, at, &data))?, PIECE);
                        let mut back = vec![0u8; PIECE];
                        assert_eq!(file.with(client, |cl, f| cl.read(f, at, &mut back))?, PIECE);
                        assert!(back == data, "thread {t} pass {pass}: bytes differ");
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| Error::InvalidArgument("a thread panicked".into()))??;
        }
        Ok(())
    })?;
    file.close(&client)?;
    assert!(file.is_closed());
    let closed = file.with(&client, |cl, f| cl.fsync(f));
    assert!(matches!(closed, Err(Error::Closed("file"))), "{closed:?}");
    let reopened = client.with(|cl| cl.open("/shared", 0, 0))?;
    assert_eq!(reopened.size(), 4 * PIECE as u64);
    client.close();
    let after = client.with(|cl| cl.stat("/shared"));
    assert!(matches!(after, Err(Error::Closed("client"))), "{after:?}");
    assert_eq!(after.err().map(|e| e.errno()), Some(libc::EBADF));
    for s in &mut servers {
        s.stop()?;
    }
    Ok(())
}

/// Requests this client sent to all servers so far.
fn requests(client: &Client) -> u64 {
    client.server_stats().iter().map(|s| s.requests).sum()
}

/// A sequential reader keeps the next chunks in flight: reading a file in quarter chunks takes
/// about one request per chunk, not four, and every byte is right; writes through this client
/// and through another client sharing the handle's change counter (as a mount's workers do)
/// are seen by the reads after them; a reader that jumps about reads nothing ahead.
#[test]
fn sequential_reads_read_ahead_and_see_every_change() -> Result<()> {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 40;
    const STEP: usize = CHUNK / 4;
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let mut c = config(2, CHUNK as u64)?;
    c.client.read_ahead = 4 * CHUNK as u64;
    let mut servers = start(dir.path(), 2, &c)?;
    let client = Client::connect(&dir.path().join("registry"), c.clone())?;
    // Writes answered before they return, as a mount's workers have them.
    c.client.write_behind = 0;
    let other = Client::connect(&dir.path().join("registry"), c)?;
    let mut data = pattern(7, CHUNKS * CHUNK);
    let f = client.open("/seq", CREATE | EXCLUSIVE, 0o644)?;
    client.write(&f, 0, &data)?;
    client.close(&f)?;

    let counter = Arc::new(AtomicU64::new(0));
    let mut reader = client.open("/seq", 0, 0)?;
    reader.share_changes(&counter);
    let mut writer = other.open("/seq", 0, 0)?;
    writer.share_changes(&counter);
    let same = client.open("/seq", 0, 0)?;
    let before = requests(&client);
    let mut back = vec![0u8; STEP];
    for (i, at) in (0..data.len()).step_by(STEP).enumerate() {
        // Each write lands in chunks the reader has in flight or arrived already.
        if at == 20 * CHUNK {
            let theirs = pattern(9, CHUNK);
            other.write(&writer, (21 * CHUNK + 5) as u64, &theirs)?;
            data[21 * CHUNK + 5..22 * CHUNK + 5].copy_from_slice(&theirs);
        }
        if at == 28 * CHUNK {
            let mine = pattern(8, CHUNK);
            client.write(&same, (30 * CHUNK) as u64, &mine)?;
            data[30 * CHUNK..31 * CHUNK].copy_from_slice(&mine);
        }
        assert_eq!(client.read(&reader, at as u64, &mut back)?, STEP);
        assert!(back[..] == data[at..at + STEP], "read {i} at {at}: bytes differ");
    }
    let sequential = requests(&client) - before;
    // 160 reads: one request per chunk, plus what the writes made it ask again (up to 4
    // chunks each) and the same-client open and write (without read-ahead: 162).
    assert!(
        sequential <= CHUNKS as u64 + 16,
        "{sequential} requests for {CHUNKS} chunks"
    );

    // Backwards, a chunk at a time: nothing is read ahead, one request per read.
    let before = requests(&client);
    let mut whole = vec![0u8; CHUNK];
    for k in (0..CHUNKS).rev() {
        assert_eq!(client.read(&reader, (k * CHUNK) as u64, &mut whole)?, CHUNK);
        assert!(whole[..] == data[k * CHUNK..(k + 1) * CHUNK], "chunk {k} differs");
    }
    assert_eq!(requests(&client) - before, CHUNKS as u64);
    for s in &mut servers {
        s.stop()?;
    }
    Ok(())
}

/// Writes behind the caller: overlapping writes land in the caller's order, the client reads
/// its own writes before any close, and another client reads every byte after it.
#[test]
fn writes_behind_keep_order_and_every_byte() -> Result<()> {
    const CHUNK: usize = 64 * 1024;
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let mut c = config(2, CHUNK as u64)?;
    c.client.write_behind = 4 * CHUNK as u64;
    let mut servers = start(dir.path(), 2, &c)?;
    let client = Client::connect(&dir.path().join("registry"), c.clone())?;
    let other = Client::connect(&dir.path().join("registry"), c)?;
    let mut expect = vec![0u8; 40 * CHUNK];
    let f = client.open("/wb", CREATE | EXCLUSIVE, 0o644)?;
    for (i, at) in (0..expect.len()).step_by(CHUNK / 4).enumerate() {
        let data = pattern(i as u64, CHUNK / 4);
        assert_eq!(client.write(&f, at as u64, &data)?, data.len());
        expect[at..at + data.len()].copy_from_slice(&data);
        if i % 7 == 3 {
            // Over the last two writes, still unanswered: the later bytes must win.
            let back = at.saturating_sub(CHUNK / 8);
            let again = pattern(1000 + i as u64, CHUNK / 4);
            client.write(&f, back as u64, &again)?;
            expect[back..back + again.len()].copy_from_slice(&again);
        }
    }
    let mut back = vec![0u8; expect.len()];
    assert_eq!(client.read(&f, 0, &mut back)?, expect.len());
    assert!(back == expect, "this client's own writes, read before close");
    client.close(&f)?;
    let g = other.open("/wb", 0, 0)?;
    back.fill(0);
    assert_eq!(other.read(&g, 0, &mut back)?, expect.len());
    assert!(back == expect, "another client after close");
    for s in &mut servers {
        s.stop()?;
    }
    Ok(())
}

/// A write behind the caller that fails is never silent: the write or the file's close says so.
#[test]
fn a_failed_write_behind_is_reported() -> Result<()> {
    const CHUNK: usize = 64 * 1024;
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let mut c = config(2, CHUNK as u64)?;
    c.client.write_behind = 16 * CHUNK as u64;
    c.client.request_timeout_s = 2.0;
    let mut servers = start(dir.path(), 2, &c)?;
    let client = Client::connect(&dir.path().join("registry"), c)?;
    let f = client.open("/lost", CREATE | EXCLUSIVE, 0o644)?;
    client.write(&f, 0, &pattern(1, 8 * CHUNK))?;
    servers[1].stop()?;
    let data = pattern(2, 8 * CHUNK);
    let outcome = client
        .write(&f, (8 * CHUNK) as u64, &data)
        .and_then(|_| client.close(&f));
    assert!(outcome.is_err(), "a write to a stopped server went unreported");
    servers[0].stop()?;
    Ok(())
}
