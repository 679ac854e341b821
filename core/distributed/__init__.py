from core.distributed.info import TPInfo, get_tp_info, set_tp_info, tp_scope

__all__ = ["TPInfo", "get_tp_info", "set_tp_info", "tp_scope"]
