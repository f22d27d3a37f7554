"""The per-pair score terms the selection kernels compute in registers (select.py, score.py).

A selector declares which of these it is (`kernel_term`, base/method/selectors.py); the kernels
take the name and turn it into the constexpr code below. A term of pair (t, u), w the routing weight:
    router_sum w | router_sq w^2 | count 1 (ties by router_sum) | calib_energy w^2 energy_E[u]
    base w^2 exp(2 g), g = z_t . W_HE[:, u] + b_E[u]
"""
TERMS = {"router_sum": 0, "router_sq": 1, "count": 2, "calib_energy": 3, "base": 4}
