"""convergence"""
