//! Load generator of `bench/connections.sh`: new connections per second through a
//! node, and what one policy change costs connections that are already open.
//!
//! ```text
//! connload serve ADDR:PORT     TCP (accept, echo until closed) and UDP (echo) on ADDR:PORT
//! connload tcp ADDR:PORT SECS  connect, then close with a reset (no TIME_WAIT: the source
//!                              ports stay free), one after the other for SECS seconds;
//!                              prints "<connections per second> <failed>"
//! connload udp ADDR:PORT SECS  a new socket (a new source port: a new flow) per datagram,
//!                              one byte sent and its echo awaited (200 ms), for SECS
//!                              seconds; prints "<flows per second> <lost>"
//! connload hold ADDR:PORT N    opens N connections and prints "ready"; then each line on
//!                              stdin is a round: one byte written on every connection
//!                              and every echo read back; prints the round's microseconds
//!                              and those of its writes alone
//! ```
//!
//! One request at a time, each waiting for its answer, so a rate is the inverse of the
//! path's latency per connection: what the rules add to a connection's first packet
//! shows in it undiluted by queueing.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

fn main() {
    if let Err(e) = run() {
        eprintln!("connload: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: connload serve|tcp|udp|hold ADDR:PORT [SECS|N]";
    let (mode, addr) = match args.as_slice() {
        [mode, addr, ..] => (mode.as_str(), addr.parse::<SocketAddr>().map_err(|e| format!("{addr}: {e}"))?),
        _ => return Err(usage.into()),
    };
    let number = || -> Result<u64, String> {
        args.get(2).ok_or_else(|| usage.to_string())?.parse().map_err(|e| format!("{}: {e}", args[2]))
    };
    match mode {
        "serve" => serve(addr),
        "tcp" => {
            let (n, failed, secs) = tcp(addr, Duration::from_secs(number()?))?;
            println!("{:.0} {failed}", n as f64 / secs);
            Ok(())
        }
        "udp" => {
            let (n, lost, secs) = udp(addr, Duration::from_secs(number()?))?;
            println!("{:.0} {lost}", n as f64 / secs);
            Ok(())
        }
        "hold" => hold(addr, number()? as usize),
        _ => Err(usage.into()),
    }
}

fn serve(addr: SocketAddr) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let socket = match addr {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }
        .map_err(|e| e.to_string())?;
        socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
        socket.bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
        let listener = socket.listen(4096).map_err(|e| e.to_string())?;
        let udp = tokio::net::UdpSocket::bind(addr).await.map_err(|e| format!("bind udp {addr}: {e}"))?;
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                let _ = udp.send_to(&buf[..n], from).await;
            }
        });
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _ = stream.set_nodelay(true);
                let mut buf = [0u8; 2048];
                while let Ok(n @ 1..) = stream.read(&mut buf).await {
                    if stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    })
}

fn tcp(addr: SocketAddr, window: Duration) -> Result<(u64, u64, f64), String> {
    let (mut n, mut failed) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < window {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(|e| e.to_string())?;
        // Closed with a reset: no TIME_WAIT, so the source ports never run out.
        socket.set_linger(Some(Duration::ZERO)).map_err(|e| e.to_string())?;
        match socket.connect_timeout(&addr.into(), Duration::from_secs(1)) {
            Ok(()) => n += 1,
            Err(_) => failed += 1,
        }
    }
    Ok((n, failed, start.elapsed().as_secs_f64()))
}

fn udp(addr: SocketAddr, window: Duration) -> Result<(u64, u64, f64), String> {
    let local: SocketAddr = match addr {
        SocketAddr::V4(_) => "0.0.0.0:0",
        SocketAddr::V6(_) => "[::]:0",
    }
    .parse()
    .map_err(|e| format!("{e}"))?;
    let (mut n, mut lost) = (0u64, 0u64);
    let mut buf = [0u8; 16];
    let start = Instant::now();
    while start.elapsed() < window {
        let socket = UdpSocket::bind(local).map_err(|e| e.to_string())?;
        socket.connect(addr).map_err(|e| e.to_string())?;
        socket.set_read_timeout(Some(Duration::from_millis(200))).map_err(|e| e.to_string())?;
        socket.send(&[1]).map_err(|e| e.to_string())?;
        match socket.recv(&mut buf) {
            Ok(_) => n += 1,
            Err(_) => lost += 1,
        }
    }
    Ok((n, lost, start.elapsed().as_secs_f64()))
}

fn hold(addr: SocketAddr, count: usize) -> Result<(), String> {
    let mut conns = Vec::with_capacity(count);
    for i in 0..count {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map_err(|e| format!("connection {i} of {count}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
        conns.push(stream);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
    for line in std::io::stdin().lock().lines() {
        line.map_err(|e| e.to_string())?;
        let start = Instant::now();
        for c in &mut conns {
            c.write_all(&[1]).map_err(|e| format!("write: {e}"))?;
        }
        let written = start.elapsed();
        let mut byte = [0u8; 1];
        for c in &mut conns {
            c.read_exact(&mut byte).map_err(|e| format!("echo: {e}"))?;
        }
        let done = start.elapsed();
        writeln!(out, "{} {}", done.as_micros(), written.as_micros())
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
