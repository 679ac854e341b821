from core.distributed.info import TPInfo, get_tp_info, set_tp_info

__all__ = ["TPInfo", "get_tp_info", "set_tp_info"]
