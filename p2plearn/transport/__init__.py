"""Transports: the native loss-tolerant engine (`Channel`) and a reliable TCP baseline (`TcpChannel`)."""
from p2plearn.transport._native import InvalidArgument, TransportError
from p2plearn.transport.arrays import message_bytes
from p2plearn.transport.channel import ANSWER_LINGER_S, CHUNK_CLAIM, Channel, ReceiverStats, SendHandle
from p2plearn.transport.delivery import Delivery, Reason
from p2plearn.transport.tcp import TcpChannel

__all__ = ["Channel", "TcpChannel", "Delivery", "Reason", "ReceiverStats", "SendHandle", "TransportError",
           "InvalidArgument", "message_bytes", "CHUNK_CLAIM", "ANSWER_LINGER_S"]
