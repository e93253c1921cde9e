"""trionsq's wire formats, sans I/O: bytes in, events out, and encoders that return bytes.

The V2 commands and frames, messages, IDENTIFY, the snappy and deflate streams, the lookupd V1 protocol, and
HTTP/1.1 requests, responses and routing (``protocol.http``). Nothing in this package reads a socket or a clock;
the drivers that do (the HTTP server, the daemons' start-up, flags and logging) are in ``runtime``.
"""

from .commands import CLS as CLS
from .commands import MAGIC_V2 as MAGIC_V2
from .commands import NOP as NOP
from .commands import Command as Command
from .commands import CommandParser as CommandParser
from .commands import encode_auth as encode_auth
from .commands import encode_command as encode_command
from .commands import encode_dpub as encode_dpub
from .commands import encode_fin as encode_fin
from .commands import encode_identify as encode_identify
from .commands import encode_mpub as encode_mpub
from .commands import encode_pub as encode_pub
from .commands import encode_rdy as encode_rdy
from .commands import encode_req as encode_req
from .commands import encode_sub as encode_sub
from .commands import encode_touch as encode_touch
from .commands import ms_to_go_duration as ms_to_go_duration
from .commands import parse_base10 as parse_base10
from .errors import E_AUTH_DISABLED as E_AUTH_DISABLED
from .errors import E_AUTH_ERROR as E_AUTH_ERROR
from .errors import E_AUTH_FAILED as E_AUTH_FAILED
from .errors import E_AUTH_FIRST as E_AUTH_FIRST
from .errors import E_BAD_BODY as E_BAD_BODY
from .errors import E_BAD_CHANNEL as E_BAD_CHANNEL
from .errors import E_BAD_MESSAGE as E_BAD_MESSAGE
from .errors import E_BAD_PROTOCOL as E_BAD_PROTOCOL
from .errors import E_BAD_TOPIC as E_BAD_TOPIC
from .errors import E_DPUB_FAILED as E_DPUB_FAILED
from .errors import E_FIN_FAILED as E_FIN_FAILED
from .errors import E_IDENTIFY_FAILED as E_IDENTIFY_FAILED
from .errors import E_INVALID as E_INVALID
from .errors import E_MPUB_FAILED as E_MPUB_FAILED
from .errors import E_PUB_FAILED as E_PUB_FAILED
from .errors import E_REQ_FAILED as E_REQ_FAILED
from .errors import E_SUB_FAILED as E_SUB_FAILED
from .errors import E_TOUCH_FAILED as E_TOUCH_FAILED
from .errors import E_UNAUTHORIZED as E_UNAUTHORIZED
from .errors import NON_FATAL_CODES as NON_FATAL_CODES
from .errors import LineTooLong as LineTooLong
from .errors import ProtocolError as ProtocolError
from .frames import CLOSE_WAIT_FRAME as CLOSE_WAIT_FRAME
from .frames import FRAME_TYPE_ERROR as FRAME_TYPE_ERROR
from .frames import FRAME_TYPE_MESSAGE as FRAME_TYPE_MESSAGE
from .frames import FRAME_TYPE_RESPONSE as FRAME_TYPE_RESPONSE
from .frames import HEARTBEAT_FRAME as HEARTBEAT_FRAME
from .frames import OK_FRAME as OK_FRAME
from .frames import Frame as Frame
from .frames import FrameDecoder as FrameDecoder
from .frames import encode_error_frame as encode_error_frame
from .frames import encode_frame as encode_frame
from .identify import IdentifyLimits as IdentifyLimits
from .identify import IdentifyResult as IdentifyResult
from .identify import negotiate as negotiate
from .message import MESSAGE_HEADER_SIZE as MESSAGE_HEADER_SIZE
from .message import MESSAGE_ID_LENGTH as MESSAGE_ID_LENGTH
from .message import Message as Message
from .message import decode_message as decode_message
from .message import encode_message as encode_message
from .message import encode_message_frame as encode_message_frame
from .message import message_id_from_int as message_id_from_int
from .message import message_id_to_int as message_id_to_int
from .names import EPHEMERAL_SUFFIX as EPHEMERAL_SUFFIX
from .names import MAX_NAME_LENGTH as MAX_NAME_LENGTH
from .names import decode_name as decode_name
from .names import encode_name as encode_name
from .names import go_quote as go_quote
from .names import is_ephemeral as is_ephemeral
from .names import is_valid_channel_name as is_valid_channel_name
from .names import is_valid_name_bytes as is_valid_name_bytes
from .names import is_valid_topic_name as is_valid_topic_name
