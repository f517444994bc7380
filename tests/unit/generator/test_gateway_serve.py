"""The gateway's listening socket: what the connections uvicorn accepts on it inherit."""

from __future__ import annotations

import asyncio
import socket

from posttrain.generator.gateway.serve import listen_socket


def test_accepted_connections_send_without_nagle_delay():
    """asyncio turns Nagle's algorithm off only on TCP-protocol sockets; the gateway's must be one.

    With protocol 0 each response's body waited for the client's delayed ACK (about 40 ms per
    request on a kept-alive connection).
    """
    seen: list[int] = []

    async def main() -> None:
        sock = listen_socket("127.0.0.1", 0)
        assert sock.proto == socket.IPPROTO_TCP

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            assert await reader.read() == b""  # the server closed after its check
            writer.close()

    asyncio.run(main())
    assert seen == [1]
