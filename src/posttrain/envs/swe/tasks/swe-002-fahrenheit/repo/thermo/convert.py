"""Convert between Celsius and Fahrenheit."""


def celsius_to_fahrenheit(celsius: float) -> float:
    """Return the Fahrenheit temperature for ``celsius`` degrees Celsius."""
    return celsius * 9 / 5 + 32


def fahrenheit_to_celsius(fahrenheit: float) -> float:
    """Return the Celsius temperature for ``fahrenheit`` degrees Fahrenheit."""
    return (fahrenheit - 32) * 9 / 5
